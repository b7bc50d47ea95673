"""A project: its folders, and every declaration in them, loaded and cross-checked."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import SpecError
from .declfile import COMMIT_RE, SHA256_RE
from .filesig import stat_signature
from .layout import STATE_DIR
from .settings import Settings, load_settings
from .specs import ModelSpec, load_model
from .targets import TargetSpec, load_targets
from .toolchains import ToolchainSpec, load_toolchain


def default_store_root() -> Path:
    """`HEFBUILD_STORE`, else the per-user cache dir (XDG on Linux)."""
    if os.environ.get("HEFBUILD_STORE"):
        return Path(os.environ["HEFBUILD_STORE"]).expanduser().absolute()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "hefbuild"


@dataclass(frozen=True)
class ProjectPaths:
    root: Path
    store: Path

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def toolchains(self) -> Path:
        return self.root / "toolchain"

    @property
    def targets(self) -> Path:
        return self.root / "targets"

    @property
    def rules(self) -> Path:
        return self.root / "rules"

    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def state(self) -> Path:
        return self.root / STATE_DIR


@dataclass(frozen=True)
class Project:
    paths: ProjectPaths
    models: dict[str, ModelSpec]
    toolchains: dict[str, ToolchainSpec]
    settings: Settings = Settings()
    stamp: str = ""  # of the declarations, when loaded through the project cache
    named: tuple[str, ...] = ()  # and the project files they name, which the stamp covers
    shared: str = ""  # the stamp without the model files (the fast path's)
    # Model files that failed to load -> their one-line error: they block only their own
    # tasks, never another model's.
    broken: dict[str, str] = field(default_factory=dict)


Declarations = tuple[dict[str, ModelSpec], dict[str, ToolchainSpec], dict[str, str]]


def load_project(root: Path, store: Path | None = None,
                 declarations: Declarations | None = None, strict: bool = True) -> Project:
    """The project at `root`; `declarations` are models, toolchains and broken models
    already loaded from unchanged files (the project cache). A bad toolchain file always
    raises (models name toolchains); a bad model file raises only when `strict`, else it
    is set aside in `broken` (doit: it blocks its own tasks only)."""
    root = root.absolute()
    paths = ProjectPaths(root, store or default_store_root())
    models, toolchains, broken = declarations or _load_declarations(paths, root, strict)
    return Project(paths, models, toolchains, load_settings(root), broken=broken)


def _load_declarations(paths: ProjectPaths, root: Path, strict: bool) -> Declarations:
    toolchains = {p.stem: load_toolchain(p, root) for p in sorted(paths.toolchains.glob("*.toml"))}
    if "host" not in toolchains:
        raise SpecError("toolchain/host.toml", "", "missing: the embedded default toolchain")
    targets = load_targets(root)  # a bad target file always raises: models name targets
    models, broken = _models(root, set(toolchains), lambda: targets, strict)
    return models, toolchains, broken


def reload_models(root: Path, toolchains: Mapping[str, ToolchainSpec],
                  before: Mapping[str, ModelSpec]) -> tuple[dict[str, ModelSpec], dict[str, str]]:
    """The models of `models/` (and the files that fail to load, as `broken`), when only
    model files may have changed since `before` was loaded: the models of a file whose TOML
    and lock are as they were when it was read are taken from `before`; only the others
    (edited, added, or broken before) are loaded. The same models as a whole load."""
    root = root.absolute()
    kept: dict[str, dict[str, ModelSpec]] = {}
    for name, model in before.items():
        if model.declared:
            kept.setdefault(model.declared[0][0], {})[name] = model
    targets = functools.cache(lambda: load_targets(root))  # read only if a file must load
    return _models(root, set(toolchains), targets, strict=False, kept=kept)


def _models(root: Path, toolchains: set[str], targets: Callable[[], dict[str, TargetSpec]],
            strict: bool, kept: Mapping[str, dict[str, ModelSpec]] | None = None,
            ) -> tuple[dict[str, ModelSpec], dict[str, str]]:
    """Each file of `models/` loaded, or taken from `kept` (its TOML's name -> its models)
    while its files are as they were when those were read; a file that fails to load raises
    when `strict`, else is set aside in `broken`."""
    models: dict[str, ModelSpec] = {}
    broken: dict[str, str] = {}
    for path in sorted((root / "models").glob("*.toml")):
        same = kept.get(_shown(path, root)) if kept else None
        if same and _as_declared(next(iter(same.values())), root):
            models.update(same)
            continue
        try:
            models.update(_model_file(path, root, toolchains, targets()))
        except SpecError as exc:
            if strict:
                raise
            broken[path.stem] = str(exc)
    return models, broken


def _model_file(path: Path, root: Path, toolchains: set[str],
                targets: dict[str, TargetSpec]) -> dict[str, ModelSpec]:
    """The model of one file and its variants, each with its files' signatures as they were
    before they were read (an edit during the load shows as a difference next time)."""
    signed = stat_signature(str(path))
    model = load_model(path, root, toolchains, targets)
    lock = _lock_path(model, path, root)
    declared = ((_shown(path, root), signed), (_shown(lock, root), stat_signature(str(lock))))
    model = _with_lock(model, lock, root)
    return _with_variants(replace(model, declared=declared))


def _as_declared(model: ModelSpec, root: Path) -> bool:
    return all(stat_signature(str(root / shown)) == sig for shown, sig in model.declared)


def _with_variants(model: ModelSpec) -> dict[str, ModelSpec]:
    """The base model and each of its variants, by name; a variant shares the base's source
    as locked (one checkpoint per model file, one lock: `models/<model>.lock.json`)."""
    variants = tuple(replace(v, source=model.source, declared=model.declared)
                     for v in model.variants)
    model = replace(model, variants=variants)
    return {model.name: model, **{v.name: v for v in variants}}


def _lock_path(model: ModelSpec, path: Path, root: Path) -> Path:
    """`models/<model>.lock.json`, or the lock `source.lock` names (shared by several models
    of one repository and revision)."""
    return root / model.source.lock if model.source.lock is not None \
        else path.with_suffix(".lock.json")


def _shown(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:  # a lock outside the project is named as it was given
        return str(path)


def _with_lock(model: ModelSpec, lock_path: Path, root: Path) -> ModelSpec:
    """A hub model whose TOML names a branch takes its commit and file digests from the lock;
    a local folder without [source.files] takes its file digests from it."""
    src = model.source
    if src.synthetic is not None or src.pinned or not lock_path.is_file():
        return model
    shown = lock_path.relative_to(root).as_posix()
    try:
        lock = json.loads(lock_path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(shown, "", f"not valid JSON ({exc})") from exc
    if not isinstance(lock, dict):
        raise SpecError(shown, "", "a JSON object written by `doit lock`")
    files = lock.get("files", {})
    if not isinstance(files, dict) or not files \
            or not all(SHA256_RE.match(str(v)) for v in files.values()):
        raise SpecError(shown, "files", "a table of file name -> sha256 hex digest")
    if src.path is not None:
        if lock.get("source") != "path":
            raise SpecError(shown, "source", f"a lock of a local folder, got one of "
                            f"{lock.get('hub')}@{lock.get('requested_revision')}; run "
                            f"`doit lock:{model.name}` again")
        return replace(model, source=replace(src, files=dict(files)))
    if lock.get("hub") != src.hub or lock.get("requested_revision") != src.revision:
        raise SpecError(shown, "requested_revision",
                        f"a lock of {src.hub}@{src.revision}; run `doit lock:{model.name}` again")
    revision = lock.get("revision", "")
    if not COMMIT_RE.match(str(revision)):
        raise SpecError(shown, "revision", "a 40-hex commit hash")
    return replace(model, source=replace(src, revision=revision, files=dict(files)))


def find_root(start: Path) -> Path:
    """The project a command run in `start` (or any folder under it) means: the nearest
    folder up the tree with a dodo.py and a models/ folder."""
    start = start.absolute()
    for folder in (start, *start.parents):
        if (folder / "dodo.py").is_file() and (folder / "models").is_dir():
            return folder
    raise SpecError(str(start), "", "a folder inside a hefbuild project (one with dodo.py and "
                    "models/)")
