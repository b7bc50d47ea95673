"""Whether a result's files are the outputs its action declares (a fetched record is
checked before any of its paths touches build/)."""

from __future__ import annotations

from pathlib import PurePosixPath

from .store import Record

_HEX = set("0123456789abcdef")


def safe_relative(path: str) -> bool:
    """A plain relative path that stays inside the stage dir."""
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and "\\" not in path and \
        all(p not in ("", ".", "..") for p in parts)


def fits_declared(record: Record, declared: tuple[str, ...]) -> bool:
    files = {d for d in declared if not d.endswith("/")}
    folders = tuple(d for d in declared if d.endswith("/"))
    for rel, out in record.outputs.items():
        if not safe_relative(rel) or len(out.digest) != 64 or not set(out.digest) <= _HEX:
            return False
        if rel not in files and not rel.startswith(folders):
            return False
    names = set(record.outputs)
    return files <= names and all(any(n.startswith(f) for n in names) for f in folders)
