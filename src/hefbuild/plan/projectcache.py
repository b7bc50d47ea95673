"""Declarations parsed once per change, not once per invocation.

Loading validates every model and toolchain file (~1 ms a model): with 200 models that is
most of a no-op `doit verify:one-model`. So the loaded models and toolchains are kept
(pickled) with a stamp of what they were made from: the stat signature of every file in
`models/`, `toolchain/` and `targets/` (the project's and hefbuild's own; TOML and lock
files), the existence of every file a declaration
names (file parameters, rules, Dockerfiles: loading checks they exist), and hefbuild's own loader
code; the stats are taken before any file is read, so that an edit during a load shows as a
difference next time. Any difference, and the TOML is loaded and checked as before, with the
same errors; where only model files differ, only those are (a model keeps the signatures its
files had when read: `ModelSpec.declared`), so an edit of one model of 1000 costs loading
that one.
Settings (`hefbuild.toml` and the environment) are read on every invocation.

On disk: `.hefbuild/project.pickle` = (FORMAT, stamp, (every model's bytes, shared
pipelines, name -> a model's bytes), toolchains, broken models, named files, the stamp
without the model files); a model is
unpickled when first asked for, or all of them at once (`lazymodels`).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import replace
from pathlib import Path

from ..declare.project import Project, load_project, reload_models
from .actions import plan_model
from .lazymodels import LazyModels, pickled
from .stamp import declarations_stamp, folders_stamp

FORMAT = 12  # 4: a model carries its variants; 5: stages carry resources; 6: and code;
# 7: a model says why it is manual; 8: and which of its parameters nothing reads; 9: each
# model pickled on its own; 10: and all of them together; 11: a model has its
# files' signatures; 12: and the stamp without the model files is kept


def load_project_cached(root: Path, store: Path | None = None) -> Project:
    root = root.absolute()
    cache = root / ".hefbuild" / "project.pickle"
    # Stat-ed before anything is read: an edit while the TOML is read shows next time.
    folders, shared = folders_stamp(root), folders_stamp(root, models=False)
    cached = _read(cache)
    if cached is None:
        return _loaded(load_project(root, store, strict=False), cache, folders, shared)
    stamp, (every, pipelines, blobs), toolchains, broken, named, shared_then = cached
    models = LazyModels(every, pipelines, blobs,
                        lambda: load_project(root, store, strict=False).models)
    if stamp == declarations_stamp(root, named, folders):
        project = load_project(root, store, declarations=(models, toolchains, broken))
        return replace(project, stamp=stamp, named=named,
                       shared=declarations_stamp(root, named, shared))
    if shared_then == declarations_stamp(root, named, shared):
        # Only model files changed (an edit, a lock, a new model): load those alone.
        kept, broken = reload_models(root, toolchains, models)
        project = load_project(root, store, declarations=(kept, toolchains, broken))
        return _loaded(project, cache, folders, shared)
    return _loaded(load_project(root, store, strict=False), cache, folders, shared)


def _loaded(project: Project, cache: Path, folders: str, shared: str) -> Project:
    """A project just loaded (in whole or in part), written to the cache with its stamps."""
    root = project.paths.root
    named = named_files(project)
    stamp, shared_stamp = (declarations_stamp(root, named, f) for f in (folders, shared))
    _write(cache, (FORMAT, stamp, pickled(project.models), project.toolchains, project.broken,
                   named, shared_stamp))
    return replace(project, stamp=stamp, named=named, shared=shared_stamp)


def named_files(project: Project) -> tuple[str, ...]:
    """Every project file a declaration names and loading checked the existence of."""
    actions = [a for m in project.models.values() for a in plan_model(m)]
    files = {p for a in actions for p in a.file_params.values()}
    # A project's target file names rules that loading checked exist.
    files |= {f"rules/{a.rule}" for a in actions}
    files |= {f"{tc.image['context']}/Dockerfile" for tc in project.toolchains.values()
              if "context" in tc.image}
    files |= {tc.venv["requirements"] for tc in project.toolchains.values() if tc.venv}
    return tuple(sorted(files))


def stamp_of(project: Project) -> str:
    """The stamp of every declaration (the task table is valid while it holds)."""
    return project.stamp or declarations_stamp(project.paths.root, named_files(project))


def shared_stamp_of(project: Project) -> str:
    """The stamp the fast path folds into every task's fingerprint: that of every
    declaration but the model files, which each verdict covers for its own model."""
    root = project.paths.root
    return project.shared or declarations_stamp(root, project.named or named_files(project),
                                                folders_stamp(root, models=False))


def _read(cache: Path) -> tuple | None:
    try:
        with open(cache, "rb") as f:
            doc = pickle.load(f)
    except Exception:  # noqa: BLE001 - any unreadable cache is a miss
        return None
    if not isinstance(doc, tuple) or len(doc) != 7 or doc[0] != FORMAT:
        return None
    models = doc[2]
    if not (isinstance(models, tuple) and len(models) == 3 and isinstance(models[2], dict)):
        return None
    return doc[1:]


def _write(cache: Path, doc: tuple) -> None:
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            pickle.dump(doc, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, cache)
    except OSError:
        tmp.unlink(missing_ok=True)

