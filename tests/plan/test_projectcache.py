"""After an edit of model files alone, the project cache loads only the files that changed
and gives the same project a whole load gives; any other change loads everything."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from engine.helpers import MODEL, edit, make_tiny_project

from hefbuild.declare import project as project_module
from hefbuild.declare.project import load_project
from hefbuild.plan.projectcache import load_project_cached


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = make_tiny_project(tmp_path / "project")
    for i in (1, 2, 3):
        shutil.copy(root / "models" / f"{MODEL}.toml", root / "models" / f"{MODEL}-{i}.toml")
    return root


@pytest.fixture
def parsed(monkeypatch) -> list[str]:
    """The model files loading parses, in order."""
    names: list[str] = []
    real = project_module.load_model

    def counting(path, *args, **kwargs):
        names.append(path.stem)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(project_module, "load_model", counting)
    return names


def loaded(root: Path, store: Path, parsed: list[str]) -> tuple[object, list[str]]:
    parsed.clear()
    project = load_project_cached(root, store)
    return project, list(parsed)


def as_whole_load(project, root: Path, store: Path) -> None:
    whole = load_project(root, store, strict=False)
    assert list(project.models) == list(whole.models)  # declaration order too
    assert dict(project.models) == dict(whole.models)
    assert project.broken == whole.broken
    assert project.toolchains == whole.toolchains


def test_an_edit_of_one_model_loads_that_model_alone(root: Path, tmp_path: Path, parsed):
    store = tmp_path / "store"
    first, names = loaded(root, store, parsed)
    assert sorted(names) == sorted(f.stem for f in (root / "models").glob("*.toml"))
    edit(root / "models" / f"{MODEL}-2.toml", "max_new_tokens = 16", "max_new_tokens = 12")
    project, names = loaded(root, store, parsed)
    assert names == [f"{MODEL}-2"]
    assert project.models[f"{MODEL}-2"] != first.models[f"{MODEL}-2"]
    assert project.models[MODEL] == first.models[MODEL]
    as_whole_load(project, root, store)
    again, names = loaded(root, store, parsed)
    assert names == []  # the cache written by the partial load holds
    assert again.stamp == project.stamp and again.shared == project.shared
    assert dict(again.models) == dict(project.models)


def test_models_added_removed_broken_and_mended(root: Path, tmp_path: Path, parsed):
    store = tmp_path / "store"
    loaded(root, store, parsed)
    models = root / "models"
    shutil.copy(models / f"{MODEL}.toml", models / f"{MODEL}-new.toml")
    (models / f"{MODEL}-1.toml").unlink()
    good = (models / f"{MODEL}-3.toml").read_text()
    (models / f"{MODEL}-3.toml").write_text(good.replace("max_new_tokens = 16",
                                                         'max_new_tokens = "many"'))
    project, names = loaded(root, store, parsed)
    assert sorted(names) == [f"{MODEL}-3", f"{MODEL}-new"]
    assert f"{MODEL}-1" not in project.models and f"{MODEL}-new" in project.models
    assert "max_new_tokens" in project.broken[f"{MODEL}-3"]
    as_whole_load(project, root, store)
    (models / f"{MODEL}-3.toml").write_text(good)
    project, names = loaded(root, store, parsed)
    assert names == [f"{MODEL}-3"]  # a broken file is read again: it has nothing cached
    assert project.broken == {} and f"{MODEL}-3" in project.models
    as_whole_load(project, root, store)


def test_a_lock_made_for_one_model_reloads_that_model(root: Path, tmp_path: Path, parsed):
    store = tmp_path / "store"
    first, _ = loaded(root, store, parsed)
    (root / "models" / f"{MODEL}-1.lock.json").write_text("{}")
    project, names = loaded(root, store, parsed)
    assert names == [f"{MODEL}-1"]
    signatures = dict(project.models[f"{MODEL}-1"].declared)
    assert signatures != dict(first.models[f"{MODEL}-1"].declared)
    as_whole_load(project, root, store)


def test_a_change_beyond_the_model_files_loads_everything(root: Path, tmp_path: Path, parsed):
    store = tmp_path / "store"
    loaded(root, store, parsed)
    edit(root / "models" / f"{MODEL}-2.toml", "max_new_tokens = 16", "max_new_tokens = 12")
    host = root / "toolchain" / "host.toml"
    host.write_text(host.read_text() + "\n# a comment\n")
    project, names = loaded(root, store, parsed)
    assert sorted(names) == sorted(f.stem for f in (root / "models").glob("*.toml"))
    as_whole_load(project, root, store)


def test_a_file_edited_as_it_is_read_is_read_again_next_time(root: Path, tmp_path: Path,
                                                             parsed, monkeypatch):
    store = tmp_path / "store"
    loaded(root, store, parsed)
    path = root / "models" / f"{MODEL}-2.toml"
    edit(path, "max_new_tokens = 16", "max_new_tokens = 12")
    real = project_module.load_model

    def edited_meanwhile(p, *args, **kwargs):
        model = real(p, *args, **kwargs)  # read as 12; then the user saves 8
        if p == path and "max_new_tokens = 12" in path.read_text():
            edit(path, "max_new_tokens = 12", "max_new_tokens = 8")
            os.utime(path, ns=(1, 1))  # mtime alone could tie; the size and ctime differ
        return model
    monkeypatch.setattr(project_module, "load_model", edited_meanwhile)
    loaded(root, store, parsed)
    project = load_project_cached(root, store)
    assert project.models[f"{MODEL}-2"] == load_project(root, store).models[f"{MODEL}-2"]
