"""Digests of files, remembered against their stat so unchanged files are never re-read.

A file's digest is reused only while (size, mtime_ns, ctime_ns, inode, device) are all
unchanged. `touch` changes mtime, so the file is hashed once more, then trusted again;
an edit that keeps size and restores mtime (`cp -p`, `tar x`) still changes ctime,
which user space cannot set, so it is never missed.

On disk: one sqlite3 file, table `digests(path TEXT PRIMARY KEY, sig TEXT, digest TEXT)`.
Absolute paths are fine here: the file is machine-local state, never shared.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from .digest import Digest, sha256_file


def stat_signature(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{st.st_dev}"


class StatCache:
    """Path -> digest, valid while the file's stat signature is unchanged."""

    def __init__(self, db_path: Path) -> None:
        self._db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self._memo: dict[str, tuple[str, Digest]] = {}
        self.bytes_hashed = 0

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._db_path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self._db_path, timeout=60, isolation_level=None)
            # A cache: losing the last writes to a crash costs a re-hash, never a wrong
            # answer (the stat signature must still match), so no fsync per insert.
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=OFF")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS digests"
                " (path TEXT PRIMARY KEY, sig TEXT NOT NULL, digest TEXT NOT NULL)"
            )
        return self._conn

    def digest(self, path: Path) -> Digest:
        """The file's SHA-256, hashing it only if its stat changed since last seen."""
        key = str(Path(path).absolute())
        st = os.stat(key)
        sig = stat_signature(st)
        known = self._lookup(key)
        if known is not None and known[0] == sig:
            return known[1]
        digest = sha256_file(Path(key))
        self.bytes_hashed += st.st_size
        self.remember(Path(key), digest, st)
        return digest

    def remember(self, path: Path, digest: Digest, st: os.stat_result | None = None) -> None:
        """Record a digest known by other means (e.g. a file just linked from the store)."""
        key = str(Path(path).absolute())
        sig = stat_signature(st if st is not None else os.stat(key))
        self._memo[key] = (sig, digest)
        self._db().execute(
            "INSERT OR REPLACE INTO digests (path, sig, digest) VALUES (?, ?, ?)",
            (key, sig, digest.hex),
        )

    def _lookup(self, key: str) -> tuple[str, Digest] | None:
        if key in self._memo:
            return self._memo[key]
        row = self._db().execute("SELECT sig, digest FROM digests WHERE path = ?", (key,))
        found = row.fetchone()
        if found is None:
            return None
        self._memo[key] = (found[0], Digest(found[1]))
        return self._memo[key]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
