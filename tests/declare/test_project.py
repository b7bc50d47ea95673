"""A hub model on a branch takes its commit and file digests from `models/<name>.lock.json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hefbuild.declare.project import default_store_root
from hefbuild.errors import SpecError

HUB = '[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "org/name"\nrevision = "main"\n'
COMMIT, SHA = "c" * 40, "a" * 64


def write_lock(proj: Path, **changes: object) -> None:
    lock = {"hub": "org/name", "requested_revision": "main", "revision": COMMIT,
            "files": {"model.safetensors": SHA}, **changes}
    (proj / "models" / "m.lock.json").write_text(json.dumps(lock))


def lock_error(load, proj: Path, **changes: object) -> str:
    write_lock(proj, **changes)
    with pytest.raises(SpecError) as err:
        load(HUB)
    assert str(err.value).startswith("models/m.lock.json: ")
    return str(err.value)


def test_lock_pins_a_branch(model, proj):
    write_lock(proj)
    src = model(HUB).source
    assert (src.revision, src.files) == (COMMIT, {"model.safetensors": SHA})
    assert src.pinned


def test_no_lock_leaves_it_unpinned(model):
    src = model(HUB).source
    assert src.revision == "main" and not src.pinned


def test_stale_lock_is_a_spec_error(load, proj):
    message = lock_error(load, proj, requested_revision="v2")
    assert "requested_revision" in message and "doit lock:m" in message


def test_lock_of_another_repo_is_a_spec_error(load, proj):
    assert "a lock of org/name@main" in lock_error(load, proj, hub="org/other")


def test_lock_with_a_branch_revision_is_a_spec_error(load, proj):
    assert "revision: a 40-hex commit hash" in lock_error(load, proj, revision="main")


def test_lock_with_a_bad_digest_is_a_spec_error(load, proj):
    assert "files: a table" in lock_error(load, proj, files={"model.safetensors": "abc"})


def test_lock_that_is_not_json_is_a_spec_error(load, proj):
    (proj / "models" / "m.lock.json").write_text("{not json")
    with pytest.raises(SpecError, match=r"^models/m\.lock\.json: not valid JSON"):
        load(HUB)


def test_lock_is_ignored_for_a_pinned_toml(model, proj):
    write_lock(proj, requested_revision="something else")
    toml = HUB.replace('"main"', f'"{"d" * 40}"') + f'\n[source.files]\n"w.bin" = "{"b" * 64}"\n'
    assert model(toml).source.revision == "d" * 40


def test_store_root_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HEFBUILD_STORE", str(tmp_path / "s"))
    assert default_store_root() == tmp_path / "s"
    monkeypatch.delenv("HEFBUILD_STORE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_store_root() == tmp_path / "cache" / "hefbuild"
