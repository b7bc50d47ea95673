"""What a model or variant name may be: it becomes task names (`export:<model>@<variant>`),
log lines and path components (`build/<model>@<variant>/`, `models/<model>.lock.json`, a
target's `placements/{model}.auto.alls`), so it is checked where it is first read.

A pattern, matched whole (`re.match` with `$` would let a trailing newline through), and a
length bound in bytes. A path component may hold at most NAME_MAX bytes; the longest one
hefbuild derives from names is `<model>@<variant>` plus a suffix, so the two bounds leave
room for `.lock.json` and for a target's `{model}` suffixes (those are checked where they
are expanded: `fits_name_max`).
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

NAME_MAX = 255  # bytes in one path component (Linux and macOS file systems)
MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
MODEL_MAX = 128
VARIANT_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
VARIANT_MAX = 64
_SHOWN = 40  # characters of a bad name an error line repeats


def model_name_problem(name: str) -> str | None:
    """What is wrong with a model's name (its file's stem), as the expected part of a
    SpecError; None when it is fine."""
    return _problem(name, MODEL_RE, MODEL_MAX, "a model file name")


def variant_name_problem(name: str) -> str | None:
    return _problem(name, VARIANT_RE, VARIANT_MAX, "a variant name")


def _problem(name: str, pattern: re.Pattern[str], limit: int, what: str) -> str | None:
    if pattern.fullmatch(name) and len(name) <= limit:  # ASCII only: characters are bytes
        return None
    return f"{what} matching {pattern.pattern} of at most {limit} characters, got {shown(name)}"


def shown(name: str) -> str:
    """A name as an error line can repeat it: quoted with its escapes (a newline stays on
    the line), cut short, with its length when it was cut."""
    if len(name) <= _SHOWN:
        return repr(name)
    return f"{name[:_SHOWN]!r}… ({len(name)} characters)"


def key_part(name: str) -> str:
    """A table name inside a key path (`variants.<name>`): bare when printable and short,
    else as TOML would quote it (`variants."ok\\n"`)."""
    if name.isprintable() and " " not in name and len(name) <= _SHOWN:
        return name
    text = name if len(name) <= _SHOWN else name[:_SHOWN] + "…"
    return json.dumps(text, ensure_ascii=False)


def fits_name_max(path: str) -> bool:
    """Whether every component of a relative path fits the file system's NAME_MAX."""
    return all(len(part.encode()) <= NAME_MAX for part in PurePosixPath(path).parts)
