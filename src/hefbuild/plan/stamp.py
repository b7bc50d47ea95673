"""What loaded declarations depend on, as one short string, computed without loading them
(the project cache and the no-op's task table are both valid while it holds)."""

from __future__ import annotations

import hashlib
import marshal
import os
from collections.abc import Iterable
from pathlib import Path

from ..declare.layout import BUILTIN_TARGETS, TARGETS_DIR

# Relative to the package: every module that decides what loading yields.
LOADER_CODE = ("declare/specs.py", "declare/toolchains.py", "declare/params.py",
               "declare/param_schema.py", "declare/targets.py", "declare/declfile.py",
               "declare/project.py", "declare/variants.py", "declare/names.py",
               "declare/mistakes.py", "declare/layout.py",
               "declare/resources.py", "declare/phases.py", "declare/settings.py",
               "declare/bounds.py", "plan/actions.py", "plan/projectcache.py",
               "plan/lazymodels.py", "plan/stamp.py")
PACKAGE = Path(__file__).parents[1]


def declarations_stamp(root: Path, named: Iterable[str], folders: str | None = None) -> str:
    """The stat signature of every file in `models/`, `toolchain/` and `targets/` (the
    project's and hefbuild's own; TOML and lock files), the existence of every file a
    declaration names (loading checks they exist), and hefbuild's own loader code.
    `folders`: the first part as `folders_stamp` gave it before the declarations were read
    (an edit while they are read then shows next time, never as the stamp of what was
    read)."""
    h = hashlib.blake2b(digest_size=16)
    h.update((folders if folders is not None else folders_stamp(root)).encode())
    h.update(code_stamp(LOADER_CODE).encode())
    for rel in named:
        h.update(f"\0{rel}\0{os.path.isfile(root / rel)}".encode())
    return h.hexdigest()


def folders_stamp(root: Path, models: bool = True) -> str:
    """The stat signatures of the declaration folders' files; without `models/` for the
    fast path, whose verdicts each cover their own model's files (ModelSpec.declared)."""
    h = hashlib.blake2b(digest_size=16)
    folders = [("toolchain", root / "toolchain"), ("targets", root / TARGETS_DIR),
               ("builtin targets", BUILTIN_TARGETS)]
    if models:
        folders.insert(0, ("models", root / "models"))
    for label, folder in folders:
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith((".toml", ".json")))
        except OSError:
            names = []
        where = f"{folder}/"
        # One hash update per folder: with 1000 models the stats are what is left to pay.
        h.update(marshal.dumps((label, names, [_stat(where + n) for n in names])))
    return h.hexdigest()


def code_stamp(modules: Iterable[str]) -> str:
    """The stat signatures of hefbuild's own modules (paths relative to the package)."""
    return "".join(f"\0{name}\0{file_sig(str(PACKAGE / name))}" for name in modules)


def _stat(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def file_sig(path: str) -> str:
    """size, mtime, ctime and inode; "-" for no file."""
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
