"""The environments of venv toolchains a store holds (`<store>/v1/venvs/`, laid out in
venvs.py): what `doit store` counts, and what `doit gc --venvs` may remove.

An environment is removed only when no declared venv toolchain of any project registered in
the store (store/storelock.py), nor of the project gc runs in, names its folder, and only
when no process uses or creates it at that moment (its `.use` and `.lock` taken without
waiting; a busy one is left for the next gc). A project that cannot be read, or a toolchain
whose identity cannot be computed (its lock gone, its base python missing), makes the names
unknown: then no finished environment is removed. A crashed creation (`.tmp-<d>-<pid>/`)
is garbage whatever the names, once no creator holds its lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..declare.toolchains import ToolchainSpec, load_toolchain
from ..errors import HefbuildError
from ..store.storelock import registered_projects
from . import venvs
from .toolchain import venv_spec_of

TMP = ".tmp-"  # a creation (venvs.py); ".gc-": a removal that a crash cut short


@dataclass(frozen=True)
class VenvInfo:
    name: str  # the entry under venvs/: a digest folder, or a .tmp- or .gc- folder
    digest: str  # the environment it is or is becoming ("" for a removal cut short)
    size: int  # bytes of its files, each inode counted once
    complete: bool  # its marker is there: a finished creation
    toolchain: str = ""  # as the marker names it ("" for a marker of an older hefbuild)
    created_at: float | None = None
    seconds: float | None = None  # how long its creation took


@dataclass(frozen=True)
class Naming:
    """The environment folders that declared toolchains name; `unsure` says why some
    names could not be known (then nothing finished may go)."""

    names: frozenset[str]
    unsure: tuple[str, ...] = ()


@dataclass(frozen=True)
class VenvGc:
    removed: list[VenvInfo] = field(default_factory=list)
    named: list[VenvInfo] = field(default_factory=list)  # kept: a declared toolchain names it
    busy: list[VenvInfo] = field(default_factory=list)  # kept: in use or being created
    unsure: list[VenvInfo] = field(default_factory=list)  # kept: the names are not all known

    @property
    def freed_bytes(self) -> int:
        return sum(v.size for v in self.removed)


# -- what the store holds --------------------------------------------------------------


def installed(venvs_root: Path) -> list[VenvInfo]:
    """Every environment folder, finished or not, with its size (largest first)."""
    try:
        entries = sorted(p for p in venvs_root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    found = [_info(p) for p in entries]
    return sorted(found, key=lambda v: (-v.size, v.name))


def _info(folder: Path) -> VenvInfo:
    name = folder.name
    digest = name[len(TMP):].rsplit("-", 1)[0] if name.startswith(TMP) else \
        "" if name.startswith(".") else name
    marker = _marker(folder / venvs.MARKER)
    return VenvInfo(folder.name, digest, tree_size(folder), marker is not None,
                    str((marker or {}).get("toolchain", "")), (marker or {}).get("created_at"),
                    (marker or {}).get("seconds"))


def _marker(path: Path) -> dict | None:
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def tree_size(folder: Path) -> int:
    """Bytes of the regular files under `folder`, a hard-linked file counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(parent, name))
            except OSError:
                continue  # removed meanwhile
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


# -- which ones declared toolchains name -----------------------------------------------


def declared_names(v1_root: Path, also: Iterable[Path] = ()) -> Naming:
    """The folders the venv toolchains of every registered project (and of `also`) name:
    the toolchain files each project holds now (toolchain/*.toml)."""
    names: set[str] = set()
    unsure: list[str] = []
    bases: dict[str, dict[str, str]] = {}
    roots = dict.fromkeys([*registered_projects(v1_root), *(p.absolute() for p in also)])
    for root in roots:
        try:
            for path in sorted((root / "toolchain").glob("*.toml")):
                tc = load_toolchain(path, root)
                if tc.kind == "venv":
                    names.add(_folder_of(tc, root, bases))
        except (HefbuildError, OSError) as exc:
            unsure.append(f"{root}: {exc}")
    return Naming(frozenset(names), tuple(unsure))


def _folder_of(tc: ToolchainSpec, root: Path, bases: dict[str, dict[str, str]]) -> str:
    python = tc.venv["python"]
    if python not in bases:
        bases[python] = venvs.probe_base(python)
    ident = venvs.identity(venv_spec_of(tc, root), bases[python])
    return ident["venv"].removeprefix("sha256:")[:venvs.DIGEST_HEX]


# -- removing --------------------------------------------------------------------------


def remove_unnamed(venvs_root: Path, naming: Naming, dry_run: bool = False) -> VenvGc:
    """Remove what no declared toolchain names (see the module docstring); what was done.
    The caller holds the store lock exclusively, so no build stores or links meanwhile."""
    done = VenvGc()
    for info in installed(venvs_root):
        garbage = info.name.startswith(".")
        if not garbage and info.digest in naming.names:
            done.named.append(info)
        elif not garbage and naming.unsure:
            done.unsure.append(info)
        else:
            with _unused(venvs_root, info) as free:
                if not free:
                    done.busy.append(info)
                    continue
                if not dry_run:
                    _remove(venvs_root, info)
                done.removed.append(info)
    return done


@contextmanager
def _unused(venvs_root: Path, info: VenvInfo) -> Iterator[bool]:
    """True while this process holds both of the environment's locks: nobody runs a stage
    in it or creates it until the block ends."""
    with ExitStack() as held:
        for suffix in (".use", ".lock") if info.digest else ():
            lock = held.enter_context(open(venvs_root / f"{info.digest}{suffix}", "a+"))
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        yield True


def _remove(venvs_root: Path, info: VenvInfo) -> None:
    """Out of the way first (one rename: it is never seen half removed), then deleted."""
    folder = venvs_root / info.name
    doomed = venvs_root / f".gc-{info.name}-{os.getpid()}"
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
    if info.complete:
        (venvs_root / f"{info.digest}.log").unlink(missing_ok=True)
