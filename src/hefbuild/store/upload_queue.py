"""Results stored locally but not yet in the remote cache: the upload queue.

Layout, under the store's `v1/`:

    uploads/<r>/.remote   the remote cache's URL (no credentials); r is the first 16 hex
                          of its SHA-256
    uploads/<r>/<key>     result `key` is to be uploaded there; holds the task's name

An entry is written before the result's record is published and removed once the upload
succeeded (or the result turned out corrupt or gone), so a `kill -9` between storing and
uploading leaves the result queued: the next run with uploads on sends it. Stdlib only, and
a run with nothing queued costs one folder listing (the end of every doit run looks).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import suppress
from pathlib import Path

_KEY_LEN = 64


class UploadQueue:
    def __init__(self, v1_root: Path, remote: str) -> None:
        self.remote = remote
        self.folder = v1_root / "uploads" / hashlib.sha256(remote.encode()).hexdigest()[:16]
        self._tmp = v1_root / "tmp"

    def add(self, key: str, task: str) -> None:
        if not (self.folder / ".remote").is_file():
            self.folder.mkdir(parents=True, exist_ok=True)
            self._write(".remote", self.remote)
        self._write(key, task)

    def pending(self) -> list[str]:
        """Queued keys, oldest first."""
        try:
            entries = [e for e in os.scandir(self.folder) if len(e.name) == _KEY_LEN]
        except FileNotFoundError:
            return []
        return [e.name for e in sorted(entries, key=_mtime)]

    def done(self, key: str) -> None:
        with suppress(OSError):
            (self.folder / key).unlink()

    def _write(self, name: str, text: str) -> None:
        self._tmp.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._tmp, prefix="queue-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.folder / name)


def pending_by_remote(v1_root: Path) -> dict[str, int]:
    """Every remote cache with results queued for it, and how many (for `doit store`)."""
    found = {}
    for folder in sorted((v1_root / "uploads").glob("*/")):
        count = sum(1 for e in os.scandir(folder) if len(e.name) == _KEY_LEN)
        if count:
            with suppress(OSError):
                found[(folder / ".remote").read_text()] = count
    return found


def _mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat().st_mtime
    except OSError:
        return 0.0
