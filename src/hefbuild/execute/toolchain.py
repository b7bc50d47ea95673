"""Toolchain identity: what a toolchain is, as it enters every key.

A `host` toolchain's identity is the interpreter's version and platform plus the installed
version of every package the toolchain file names; a `venv` toolchain's, the digest of its lock
file and base interpreter (execute/venvs.py), which needs no environment to exist.

Reading package metadata costs ~50 ms, too much for a no-op build, so identities are cached
in `.hefbuild/toolchains.json` against the stat of the interpreter and of its site-packages
folders (installing or removing a package changes the folder's mtime), or of a venv
toolchain's lock file and base interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HefbuildError, StageError, ToolchainMismatch

if TYPE_CHECKING:
    from ..declare.toolchains import ToolchainSpec
    from . import venvs
    from .base import Watch

_PROBE = """
import importlib.metadata as md, json, platform, sys, sysconfig
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
print(json.dumps({
    "python": platform.python_version(),
    "implementation": sys.implementation.name,
    "platform": sysconfig.get_platform(),
    "packages": {n: v(n) for n in json.loads(sys.argv[1])},
}))
"""

_SITE_DIRS = """
import json, site, sys
print(json.dumps(sorted({p for p in sys.path if p.endswith("-packages")})))
"""


def interpreter_path(spec: ToolchainSpec) -> str:
    """The python that runs a stage's rule here. A device toolchain's `interpreter` is the
    python on the device host; its rule itself runs in doit's own environment."""
    return _interpreter(spec.kind, spec.interpreter)


def _interpreter(kind: str, interpreter: str) -> str:
    return sys.executable if interpreter == "current" or kind in ("ssh", "local") \
        else interpreter


# What a toolchain's stamp is computed from, as plain values: (kind, interpreter, package
# names, venv python, venv requirements file relative to the project). The no-op's task
# table keeps these, so that it computes the stamp without loading a declaration.
StampRecipe = tuple[str, str, tuple[str, ...], str, str]


def stamp_recipe(spec: ToolchainSpec) -> StampRecipe:
    venv = spec.venv or {}
    return (spec.kind, spec.interpreter, tuple(sorted(spec.packages)),
            venv.get("python", ""), venv.get("requirements", ""))


def toolchain_stamp(recipe: StampRecipe | list, project_root: Path) -> str:
    """What a host toolchain's identity hangs on (interpreter and site-packages stat), a
    venv's (its lock file's and its base interpreter's stat); other kinds are pinned by
    their declarations."""
    kind, interpreter, packages, venv_python, requirements = recipe
    if kind == "venv":
        return _venv_stamp(venv_python, project_root / requirements)
    return _stamp(_interpreter(kind, interpreter), packages) if kind == "host" else kind


def _venv_stamp(python: str, requirements: Path) -> str:
    """A changed lock is a new identity."""
    found = shutil.which(python) or python
    paths = (str(requirements), os.path.realpath(found))
    return "|".join(["venv", *(_stat_part(p, size=True) for p in paths)])


def _stat_part(path: str, size: bool) -> str:
    """`path:[size:]mtime:inode`, or `path:-` when there is nothing there."""
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:-"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}" if size else \
        f"{path}:{st.st_mtime_ns}:{st.st_ino}"


class ToolchainResolver:
    """Identities of toolchains: a host's cached on disk across invocations, a docker
    toolchain's read from its committed lock file."""

    def __init__(self, cache_file: Path, toolchain_dir: Path | None = None) -> None:
        self._cache_file = cache_file
        self._toolchain_dir = toolchain_dir
        self._memo: dict[str, dict[str, Any]] = {}

    def identity(self, spec: ToolchainSpec) -> dict[str, Any]:
        if spec.name not in self._memo:
            self._memo[spec.name] = self._identity(spec)
        return self._memo[spec.name]

    def _identity(self, spec: ToolchainSpec) -> dict[str, Any]:
        if spec.kind == "docker":
            return self._docker_identity(spec)
        if spec.kind in ("ssh", "local"):
            # The release pins, not the host: an identical device elsewhere is the same.
            return {"kind": "device", **spec.device["pins"]}
        if spec.kind == "venv":
            from . import venvs  # only a venv toolchain needs it (not a no-op of a host one)

            return self._cached(spec, lambda: venvs.identity(self.venv_spec(spec),
                                                             self._venv_base(spec)))
        return self._cached_or_probe(spec)

    # -- venv toolchains (execute/venvs.py) ----------------------------------------------

    def venv_spec(self, spec: ToolchainSpec) -> venvs.VenvSpec:
        return venv_spec_of(spec, self._project_root())

    def _venv_base(self, spec: ToolchainSpec) -> dict[str, str]:
        key = f"venv-base:{spec.venv['python']}"
        if key not in self._memo:
            from . import venvs

            self._memo[key] = venvs.probe_base(spec.venv["python"])
        return self._memo[key]

    def venv_env(self, spec: ToolchainSpec, venvs_root: Path, say: Callable[[str], None],
                 watch: Watch | None = None) -> AbstractContextManager[venvs.Ready]:
        """A venv toolchain's environment, created on first use, in use while the block runs."""
        from . import venvs

        return venvs.using(self.venv_spec(spec), self.identity(spec), self._venv_base(spec),
                           venvs_root, say, watch)

    def _docker_identity(self, spec: ToolchainSpec) -> dict[str, Any]:
        lock = read_image_lock(self._toolchain_dir, spec) if self._toolchain_dir else None
        if lock is None:
            raise StageError(f"{spec.file}: no pinned image (toolchain/{spec.name}.lock.json); "
                             f"build and pin it with `doit image:{spec.name}`")
        return {"kind": "docker", "image_id": lock["image_id"], "interpreter": spec.interpreter}

    def stamp(self, spec: ToolchainSpec) -> str:
        return toolchain_stamp(stamp_recipe(spec), self._project_root())

    def _project_root(self) -> Path:
        return self._toolchain_dir.parent if self._toolchain_dir else Path.cwd()

    def check(self, spec: ToolchainSpec) -> None:
        """Refuse to run a stage in an environment that lacks a pinned package version."""
        if spec.kind != "host":
            return  # an image is pinned by ID; a device's versions are checked by its stage
        installed = self.identity(spec)["packages"]
        for name, wanted in sorted(spec.packages.items()):
            have = installed.get(name)
            if wanted != "*" and (have is None or have.split("+")[0] != wanted):
                found = "not installed" if have is None else f"{have} installed"
                get = f"download it from {spec.wheels_source} and install it" \
                    if spec.wheels_source else "install it"
                raise ToolchainMismatch(
                    f"{spec.file}: packages.{name}: version {wanted} required, {found} in "
                    f"{interpreter_path(spec)} ({get}, or run the stage in another toolchain)")

    def _cached_or_probe(self, spec: ToolchainSpec) -> dict[str, Any]:
        python = interpreter_path(spec)
        return self._cached(spec, lambda: {"kind": spec.kind,
                                           **_probe(python, sorted(spec.packages))})

    def _cached(self, spec: ToolchainSpec, compute: Callable[[], dict[str, Any]]
                ) -> dict[str, Any]:
        stamp = self.stamp(spec)
        cache = self._load_cache()
        entry = cache.get(spec.name)
        if entry and entry.get("stamp") == stamp:
            return entry["identity"]
        identity = compute()
        cache[spec.name] = {"stamp": stamp, "identity": identity}
        self._save_cache(cache)
        return identity

    def _load_cache(self) -> dict[str, Any]:
        try:
            return json.loads(self._cache_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save_cache(self, cache: dict[str, Any]) -> None:
        self._cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._cache_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cache, sort_keys=True, indent=1))
        os.replace(tmp, self._cache_file)


def venv_spec_of(spec: ToolchainSpec, root: Path) -> venvs.VenvSpec:
    """What a venv toolchain file of the project at `root` declares (its lock, by path)."""
    from . import venvs

    return venvs.VenvSpec(spec.name, spec.venv["python"], root / spec.venv["requirements"])


def image_lock_path(toolchain_dir: Path, spec: ToolchainSpec) -> Path:
    return toolchain_dir / f"{spec.name}.lock.json"


def read_image_lock(toolchain_dir: Path, spec: ToolchainSpec) -> dict[str, Any] | None:
    try:
        lock = json.loads(image_lock_path(toolchain_dir, spec).read_text())
    except (OSError, ValueError):
        return None
    image_id = lock.get("image_id") if isinstance(lock, dict) else None
    if not isinstance(image_id, str) or not image_id.startswith("sha256:"):
        return None
    return lock


def _stamp(python: str, packages: Iterable[str]) -> str:
    # The same interpreter is reached as .venv/bin/python and .venv/bin/python3: one stamp.
    real = os.path.realpath(python)
    parts = [real, ",".join(sorted(packages))]
    return "|".join(parts + [_stat_part(d, size=False) for d in [real, *_site_dirs(python)]])


def _site_dirs(python: str) -> list[str]:
    if python == sys.executable:
        return sorted({p for p in sys.path if p.endswith("-packages")})
    return json.loads(_run(python, [_SITE_DIRS]))


_PROBED: dict[tuple[str, ...], tuple[str, dict[str, Any]]] = {}


def probe(python: str, packages: list[str]) -> dict[str, Any]:
    """An interpreter's identity fields (python, implementation, platform, packages) as a
    host toolchain's key has them; a cluster node checks its own interpreter with it. Kept
    per process against the same stamp as the driver's cache (a Ray worker runs stage after
    stage; an install moves the stamp), so a node probes once, not once per stage."""
    stamp, key = _stamp(python, packages), (python, *packages)
    if key not in _PROBED or _PROBED[key][0] != stamp:
        _PROBED[key] = (stamp, _probe(python, packages))
    return _PROBED[key][1]


def _probe(python: str, packages: list[str]) -> dict[str, Any]:
    # A subprocess even for the current interpreter: its answer is cached, and importing
    # package metadata here would slow every doit invocation.
    return json.loads(_run(python, [_PROBE, json.dumps(packages)]))


def _run(python: str, args: list[str]) -> str:
    try:
        done = subprocess.run([python, "-c", *args], capture_output=True, text=True, check=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise HefbuildError(f"cannot run toolchain interpreter {python}: {exc}") from exc
    return done.stdout
