"""What a rule left in its out/ folder, as the declared outputs to store.

Only regular files are stored, each by its digest: a symlink could point anywhere (and
change under its digest), and a FIFO, socket or device has no content to keep. Each entry
is looked at with lstat, never followed and never opened (opening a FIFO with no writer
would block the build), and a refusal says what was found where: the rule's author learns
what to fix, not that an output that is there "was not written".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import MissingOutput

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISREG, "a regular file"))
_SHOWN = 80  # characters of a link's target an error line repeats


def kind_of(path: Path) -> str | None:
    """What is at `path`, in words (`a symlink (to ../x)`); None when nothing is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return f"a symlink (to {_link_target(path)})"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _link_target(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        return "?"
    if target.isprintable() and len(target) <= _SHOWN:
        return target
    return repr(target[:_SHOWN]) + ("…" if len(target) > _SHOWN else "")


def collect_outputs(who: str, declared: tuple[str, ...], out: Path) -> dict[str, Path]:
    """Every declared output under `out`, by its path relative to `out`; `who` begins each
    error line (`<stage>:<model>: rules/<rule>`). Raises MissingOutput."""
    found: dict[str, Path] = {}
    for decl in declared:
        if decl.endswith("/"):
            found.update(_folder(who, decl, out))
        else:
            found[decl] = _file(who, decl, out / decl)
    return found


def _file(who: str, decl: str, path: Path) -> Path:
    kind = kind_of(path)
    if kind is None:
        raise MissingOutput(f"{who} exited 0 but did not write declared output {decl}")
    if kind == "a folder":
        raise MissingOutput(f"{who} wrote declared output {decl} as a folder; it is declared "
                            f"a file (a folder output is declared as {decl}/)")
    if kind != "a regular file":
        raise MissingOutput(f"{who} wrote declared output {decl} as {kind}; outputs must be "
                            f"regular files")
    return path


def _folder(who: str, decl: str, out: Path) -> dict[str, Path]:
    folder = out / decl.rstrip("/")
    kind = kind_of(folder)
    if kind not in (None, "a folder"):
        raise MissingOutput(f"{who} wrote declared output folder {decl} as {kind}; it is "
                            f"declared a folder of regular files")
    files = _regular_files(who, decl, folder, out) if kind else []
    if not files:
        raise MissingOutput(f"{who} exited 0 but left no files in declared output folder "
                            f"{decl}")
    return {p.relative_to(out).as_posix(): p for p in files}


def _regular_files(who: str, decl: str, folder: Path, out: Path) -> list[Path]:
    """Every file under the folder, in name order; anything else but a folder refused."""
    files = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            files += _regular_files(who, decl, path, out)
        elif entry.is_file(follow_symlinks=False):
            files.append(path)
        else:
            raise MissingOutput(f"{who} left {kind_of(path)} {path.relative_to(out).as_posix()}"
                                f" in declared output folder {decl}; outputs must be regular "
                                f"files")
    return files
