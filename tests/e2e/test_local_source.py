"""A model from a local checkpoint folder: locked offline, fixed-output, movable.

The folder is a copy of tiny-llama's fetched checkpoint (a real, loadable one), so every
stage after fetch has the same inputs as tiny-llama's and restores from the shared store.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hefbuild.engine.engine import Engine

from .conftest import Project, assert_consistent

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not hasattr(Engine, "_source_dir"),
                       reason="needs the engine change of /tmp/local-source-engine.patch"),
]

MODEL = "local-llama"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
NOT_CHECKPOINT = ("README.md", ".gitattributes", "onnx/model.onnx")


@pytest.fixture
def folder(project: Project, tmp_path: Path) -> Path:
    """tiny-llama's checkpoint outside the project, with files a lock must leave out."""
    dest = tmp_path / "checkpoints" / "tiny"
    dest.mkdir(parents=True)
    for src in sorted((project.root / "build/tiny-llama/fetch/checkpoint").iterdir()):
        shutil.copyfile(src, dest / src.name)  # writable copies, not the store's links
    for rel in NOT_CHECKPOINT:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text("not part of the checkpoint\n")
    return dest


def declare(project: Project, path: str) -> None:
    """tiny-llama's declaration with `[source] path = …` instead of its synthetic recipe."""
    text = (project.root / "models/tiny-llama.toml").read_text()
    head, rest = text.split("[source.synthetic]", 1)
    stages = rest[rest.index("\n[stages."):]
    (project.root / f"models/{MODEL}.toml").write_text(f'{head}[source]\npath = "{path}"\n'
                                                       f"{stages}")


def tasks() -> set[str]:
    return {f"{s}:{MODEL}" for s in ("fetch", "export", "quantize", "compile", "verify")}


def test_locks_offline_builds_and_moves_without_rebuilding(project: Project, folder: Path,
                                                           tmp_path: Path):
    declare(project, str(folder))
    locked = project.doit(f"lock:{MODEL}", env=OFFLINE)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    lock = json.loads((project.root / f"models/{MODEL}.lock.json").read_text())
    expected = {p.name for p in folder.iterdir() if p.is_file()} - set(NOT_CHECKPOINT)
    assert lock["source"] == "path" and set(lock["files"]) == expected
    assert str(folder) not in json.dumps(lock)

    built = project.doit(f"verify:{MODEL}", env=OFFLINE)
    assert built.returncode == 0, built.stdout + built.stderr
    assert built.outcomes()[f"fetch:{MODEL}"] == "built"
    assert set(built.outcomes()) == tasks()
    ckpt = project.root / f"build/{MODEL}/fetch/checkpoint"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(expected)
    fetch = project.manifest(f"fetch:{MODEL}")
    assert fetch["description"]["source"] == {"local": True, "files": lock["files"]}
    assert str(folder) not in json.dumps(fetch)
    # the same checkpoint as tiny-llama's: every later stage shares its key
    assert project.manifest(f"export:{MODEL}")["key"] == project.manifest(
        "export:tiny-llama")["key"]

    # Moved into the project, named relative to it: nothing to do.
    moved = project.root / "checkpoints" / "tiny"
    moved.parent.mkdir()
    folder.rename(moved)
    declare(project, "checkpoints/tiny")
    assert_consistent(project, MODEL)


def test_an_edited_file_fails_fetch_naming_it_and_both_digests(project: Project,
                                                               folder: Path):
    declare(project, str(folder))
    assert project.doit(f"lock:{MODEL}", env=OFFLINE).returncode == 0
    declared = json.loads((project.root / f"models/{MODEL}.lock.json").read_text())["files"]
    config = folder / "config.json"
    config.write_text(config.read_text() + " ")
    import hashlib

    actual = hashlib.sha256(config.read_bytes()).hexdigest()
    run = project.doit("-a", f"fetch:{MODEL}", env=OFFLINE)  # -a: not the stored result
    assert run.returncode != 0
    lines = [ln for ln in (run.stdout + run.stderr).splitlines() if "sha256 mismatch" in ln]
    assert lines, run.stdout + run.stderr
    assert "config.json" in lines[0] and actual in lines[0]
    assert declared["config.json"] in lines[0]


def test_a_folder_without_a_lock_says_to_lock_it(project: Project, folder: Path):
    declare(project, str(folder))
    run = project.doit(f"fetch:{MODEL}", env=OFFLINE)
    assert run.returncode != 0
    assert f"doit lock:{MODEL}" in run.stdout + run.stderr


def test_a_missing_folder_is_one_spec_error(project: Project, tmp_path: Path):
    declare(project, str(tmp_path / "gone"))
    message = f"models/{MODEL}.toml: source.path: folder '{tmp_path / 'gone'}' does not exist"
    listed = project.doit("list")  # the other models' tasks are listed; this one is warned of
    assert listed.returncode == 0 and f"WARNING: {message}" in listed.stderr
    run = project.doit(f"verify:{MODEL}")
    assert run.returncode != 0
    assert run.stderr.strip() == f"ERROR: {message}"
