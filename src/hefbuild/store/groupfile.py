"""A file of named groups of bytes, of which a reader reads only those it asks for.

The no-op's caches (`.hefbuild/fastpath.bin`, `.hefbuild/tasks.bin`) keep one group per
model. `doit verify:one` with 1000 models declared needs one group of each; reading and
decoding the whole file (2.6 MB of verdicts at 1000 models) was most of what declaring the
other 999 cost it. So the groups sit back to back behind a small index, and the file is
mapped: a reader touches the index and the pages of the groups it takes.

Layout: MAGIC, the header's length (u32, little-endian), the marshal of the header
{"meta": anything marshal keeps, "index": {name: (offset, length)}} (offsets from the end
of the header), then the groups. Written to a temporary file and renamed over the old one,
so a reader's mapping always shows one whole file.
"""

from __future__ import annotations

import marshal
import mmap
import os
import struct
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

MAGIC = b"HGF1"
_LEN = struct.Struct("<I")


class Groups(MutableMapping[str, bytes]):
    """name -> a group's bytes, read from the mapped file when asked for; groups set or
    deleted here shadow those of the file (nothing is written back until `write_groups`)."""

    def __init__(self, data: bytes | mmap.mmap = b"", base: int = 0,
                 index: Mapping[str, tuple[int, int]] | None = None) -> None:
        self._data, self._base = data, base
        self._index = dict(index or {})
        self._set: dict[str, bytes] = {}

    def __getitem__(self, name: str) -> bytes:
        if name in self._set:
            return self._set[name]
        try:
            offset, length = self._index[name]
        except (TypeError, ValueError):
            raise KeyError(name) from None
        start = self._base + offset
        group = self._data[start:start + length] if offset >= 0 and length >= 0 else b""
        if len(group) != length:  # a damaged file: the group is not there
            raise KeyError(name)
        return group

    def __setitem__(self, name: str, group: bytes) -> None:
        self._set[name] = group

    def __delitem__(self, name: str) -> None:
        found = self._set.pop(name, None) is not None
        found = self._index.pop(name, None) is not None or found
        if not found:
            raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in self._set or name in self._index

    def __iter__(self) -> Iterator[str]:
        yield from self._set
        yield from (n for n in self._index if n not in self._set)

    def __len__(self) -> int:
        return len(self._set) + sum(1 for n in self._index if n not in self._set)


def read_groups(path: Path) -> tuple[Any, Groups] | None:
    """(meta, groups) of the file; None when it is absent, empty or not such a file."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # absent, unreadable, or empty (nothing to map)
        return None
    try:
        if data[:4] != MAGIC:
            return None
        (size,) = _LEN.unpack(data[4:8])
        header = marshal.loads(data[8:8 + size])
        meta, index = header["meta"], header["index"]
        if not isinstance(index, dict):
            return None
    except (ValueError, EOFError, TypeError, KeyError, struct.error):
        return None
    return meta, Groups(data, 8 + size, index)


def write_groups(path: Path, meta: Any, groups: Mapping[str, bytes]) -> None:
    """Replace the file with these groups (atomically); an OSError is the caller's."""
    index, offset, parts = {}, 0, []
    for name, group in groups.items():
        index[name] = (offset, len(group))
        parts.append(group)
        offset += len(group)
    header = marshal.dumps({"meta": meta, "index": index})
    _sweep(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(MAGIC + _LEN.pack(len(header)) + header)
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sweep(path: Path) -> None:
    """Temporary files of writers that died before their rename (kill -9): never read, and
    removed here so they do not pile up; a live writer's own is left alone."""
    for tmp in path.parent.glob(f".{path.name}.*"):
        pid = tmp.name.rsplit(".", 1)[1]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True
