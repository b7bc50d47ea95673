"""The project cache gives each model back when first asked for, equal to the one loaded
from its file and sharing its target's pipeline as those did; a damaged entry is read
from its file again; an edit of a model file still misses the cache."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

from engine.helpers import MODEL, make_tiny_project

from hefbuild.declare.project import load_project
from hefbuild.plan.lazymodels import LazyModels
from hefbuild.plan.projectcache import load_project_cached


def three_models(tmp_path: Path) -> Path:
    root = make_tiny_project(tmp_path / "project")
    for i in (1, 2):
        shutil.copy(root / "models" / f"{MODEL}.toml", root / "models" / f"{MODEL}-{i}.toml")
    return root


def test_each_model_comes_back_as_loaded_and_only_when_asked(tmp_path: Path):
    root = three_models(tmp_path)
    store = tmp_path / "store"
    loaded = load_project_cached(root, store)  # a miss: parsed, then written
    cached = load_project_cached(root, store)
    assert isinstance(cached.models, LazyModels)
    assert list(cached.models) == list(loaded.models)
    assert repr(cached.models).endswith("0 decoded)")  # nothing decoded to list them
    assert cached.models[f"{MODEL}-1"] == loaded.models[f"{MODEL}-1"]
    assert repr(cached.models).endswith("1 decoded)")
    assert dict(cached.models) == dict(load_project(root, store).models)
    pipelines = {id(m.pipeline) for m in cached.models.values()}  # all, from one pickle
    assert len(pipelines) == 1  # one target: one pipeline, as when loaded
    one = load_project_cached(root, store).models
    assert len({id(one[name].pipeline) for name in one}) == 1  # decoded one by one
    assert pickle.loads(pickle.dumps(cached.models)) == dict(loaded.models)


def test_a_damaged_model_entry_is_read_from_its_file(tmp_path: Path):
    root = three_models(tmp_path)
    store = tmp_path / "store"
    loaded = load_project_cached(root, store)
    cache = root / ".hefbuild" / "project.pickle"
    doc = list(pickle.loads(cache.read_bytes()))
    every, shared, blobs = doc[2]
    blobs[MODEL] = b"\x80\x05garbage"
    doc[2] = (b"\x80\x05garbage", shared, blobs)
    cache.write_bytes(pickle.dumps(tuple(doc)))
    again = load_project_cached(root, store)
    assert isinstance(again.models, LazyModels)
    assert again.models[MODEL] == loaded.models[MODEL]
    assert dict(again.models.items()) == dict(loaded.models)  # all at once, from the files


def test_an_edited_model_file_misses_the_cache(tmp_path: Path):
    root = three_models(tmp_path)
    store = tmp_path / "store"
    load_project_cached(root, store)
    path = root / "models" / f"{MODEL}-2.toml"
    path.write_text(path.read_text().replace("max_new_tokens = 16", "max_new_tokens = 12"))
    edited = load_project_cached(root, store)  # that file read again (test_projectcache.py)
    assert edited.models[f"{MODEL}-2"] != edited.models[MODEL]
    assert edited.models[f"{MODEL}-2"] == load_project(root, store).models[f"{MODEL}-2"]
