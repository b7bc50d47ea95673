"""`[source] path = "…"`: a local checkpoint folder, fixed-output like a hub revision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hefbuild.errors import HefbuildError, SpecError
from hefbuild.execute.hub import lock_model
from hefbuild.plan.actions import plan_model

SHA = "a" * 64
COMMIT = "c" * 40


def local(path: str, extra: str = "") -> str:
    return f'[model]\ntarget = "cpu-ort"\n\n[source]\npath = "{path}"\n{extra}'


def spec_error(load, text: str) -> str:
    with pytest.raises(SpecError) as err:
        load(text)
    message = str(err.value)
    assert "\n" not in message and message.startswith("models/")
    return message


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "sub/extra.json",
                 "README.md", ".gitattributes", "chat_template.jinja"):
        (folder / name).write_text(f"contents of {name}\n")
    return folder


def test_an_absolute_folder_loads_unpinned_until_locked(model, ckpt):
    src = model(local(str(ckpt))).source
    assert src.path == str(ckpt) and src.hub is None and not src.pinned


def test_a_relative_folder_is_project_relative(model, proj):
    (proj / "checkpoints" / "x").mkdir(parents=True)
    assert model(local("checkpoints/x")).source.path == str(proj / "checkpoints" / "x")


def test_tilde_is_expanded(model, tmp_path, monkeypatch, ckpt):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert model(local("~/ckpt")).source.path == str(ckpt)


def test_declared_files_pin_it(model, ckpt):
    src = model(local(str(ckpt), f'\n[source.files]\n"config.json" = "{SHA}"\n')).source
    assert src.pinned and src.files == {"config.json": SHA}


@pytest.mark.parametrize(("text", "expected"), [
    (local("/no/such/dir"), "models/m.toml: source.path: folder '/no/such/dir' does not exist"),
    (local("data"), None),  # placeholder, replaced below: a file is not a folder
    ('[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "/some/dir"\nrevision = "main"\n',
     "models/m.toml: source.hub: a hub repository id like 'org/name', got '/some/dir' "
     "(a local folder? use source.path)"),
    ('[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "~/models/x"\nrevision = "main"\n',
     "(a local folder? use source.path)"),
    ('[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "./x"\nrevision = "main"\n',
     "(a local folder? use source.path)"),
    ('[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "org/name"\nrevision = "main"\n'
     'path = "/tmp"\n', "models/m.toml: source: either hub + revision or path, not both"),
    (local("/tmp", 'revision = "main"\n'), "models/m.toml: source.revision: only with "
                                           "source.hub"),
    (local("/tmp", "\n[source.synthetic]\narchitecture = \"llama\"\nseed = 1\n"),
     "models/m.toml: source: either path or [source.synthetic], not both"),
    (local("/tmp", 'lock = "shared.json"\n'),
     "models/m.toml: source.lock: a lock file models/<name>.lock.json, got 'shared.json'"),
    (local("/tmp", f'\n[source.files]\n"config.json" = "{"z" * 64}"\n'),
     "models/m.toml: source.files.config.json: a sha256 hex digest"),
    (local("", ""), "models/m.toml: source.path: a checkpoint folder"),
], ids=["missing", "file", "hub-abs", "hub-tilde", "hub-dot", "both", "revision", "synthetic",
        "lock", "digest", "empty"])
def test_bad_local_sources_are_one_line(load, proj, text, expected):
    if expected is None:
        (proj / "data" / "f.txt").write_text("x")
        text, expected = local("data/f.txt"), "models/m.toml: source.path: folder " \
                                              "'data/f.txt' is not a folder"
    assert expected in spec_error(load, text)


def test_the_fetch_key_holds_digests_never_the_folder(model, ckpt):
    m = model(local(str(ckpt), f'\n[source.files]\n"config.json" = "{SHA}"\n'))
    fetch = next(a for a in plan_model(m) if a.stage == "fetch")
    assert fetch.source == {"local": True, "files": {"config.json": SHA}}
    assert str(ckpt) not in json.dumps([fetch.source, fetch.file_params, fetch.params])


def test_lock_lists_checkpoint_files_only_and_pins_the_model(load, proj, ckpt):
    project = load(local(str(ckpt)))
    assert lock_model(project, "m") == {"files": 5, "lock": "models/m.lock.json"}
    lock = json.loads((proj / "models" / "m.lock.json").read_text())
    assert lock["source"] == "path" and "path" not in lock
    assert sorted(lock["files"]) == ["chat_template.jinja", "config.json", "model.safetensors",
                                     "sub/extra.json", "tokenizer.json"]
    src = load().models["m"].source
    assert src.pinned and src.files == lock["files"]


def test_a_moved_folder_keeps_its_lock(load, proj, ckpt, tmp_path):
    lock_model(load(local(str(ckpt))), "m")
    before = load().models["m"].source.files
    moved = tmp_path / "elsewhere"
    ckpt.rename(moved)
    assert load(local(str(moved))).models["m"].source.files == before


def test_a_shared_lock_serves_several_models(load, proj, ckpt):
    shared = 'lock = "models/shared.lock.json"\n'
    project = load(local(str(ckpt), shared))
    lock_model(project, "m")
    assert (proj / "models" / "shared.lock.json").is_file()
    assert not (proj / "models" / "m.lock.json").exists()
    (proj / "models" / "n.toml").write_text(local(str(ckpt), shared))
    models = load().models
    assert models["m"].source.files == models["n"].source.files and models["n"].source.pinned


def test_a_shared_hub_lock_is_checked_against_the_repository(load, proj):
    lock = {"hub": "org/name", "requested_revision": "main", "revision": COMMIT,
            "files": {"model.safetensors": SHA}}
    (proj / "models" / "shared.lock.json").write_text(json.dumps(lock))
    hub = '[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "org/name"\nrevision = "main"\n' \
          'lock = "models/shared.lock.json"\n'
    src = load(hub).models["m"].source
    assert src.pinned and src.revision == COMMIT
    message = spec_error(load, hub.replace("org/name", "org/other"))
    assert message.startswith("models/shared.lock.json: requested_revision")


def test_a_hub_lock_does_not_pin_a_local_folder(load, proj, ckpt):
    lock = {"hub": "org/name", "requested_revision": "main", "revision": COMMIT,
            "files": {"model.safetensors": SHA}}
    (proj / "models" / "m.lock.json").write_text(json.dumps(lock))
    message = spec_error(load, local(str(ckpt)))
    assert "a lock of a local folder" in message and "doit lock:m" in message


def test_lock_of_a_folder_without_checkpoint_files_fails(load, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("hi")
    with pytest.raises(HefbuildError, match="no checkpoint files"):
        lock_model(load(local(str(empty))), "m")
