"""Digests of files, remembered per inode against its stat, so unchanged files are never re-read.

A row is keyed by (device, inode), not by path: every hard link of a file, and a file
renamed into place (a restore is staged, then renamed), share one row, so a digest is
remembered where the file ends up and a restore adds no row. The table lives in the store
and is shared by every project using that store: what one project learned about an
object, the others know.

A row is trusted while size, mtime_ns and ctime_ns are unchanged. `touch` changes mtime,
so the file is hashed once more; an edit that keeps size and restores mtime (`cp -p`,
`tar x`, `touch -d`) still changes ctime, which user space cannot set, so it is caught.

Adding or removing a hard link (a restore in another project, `rm -rf build`) changes the
inode's ctime and link count, never its bytes. For a file without write permission (every
store object, every file hefbuild puts in build/), a changed ctime with a changed link
count and the same size and mtime is taken as exactly that, and the row is updated: a
restore stays constant-time whatever the size. Writing such a file needs a chmod first,
which changes ctime but not the link count, so a chmod-then-write through a link is still
caught. Not caught: a same-size write with mtime restored *and* write bits removed again
*and* a link added or removed before the next look; the store's read of a result is the
last line of defence there (`doit gc` or a deleted store object heals it).

On disk (sqlite3, WAL): `files(dev, ino, size, mtime_ns, ctime_ns, nlink, digest, path,
seen)` with primary key (dev, ino); `path` is where the file was last seen (for pruning)
and `seen` when the row was last written. Absolute paths are fine: the table is
machine-local state, never shared. Rows whose path is gone are pruned at most once a day,
and the table never holds more than `MAX_ROWS`.
"""

from __future__ import annotations

import os
import sqlite3
import stat as stat_mod
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..digest import Digest, sha256_file

_INSERT = "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
MAX_ROWS = 200_000
PRUNE_EVERY_S = 24 * 3600
_WRITE_BITS = stat_mod.S_IWUSR | stat_mod.S_IWGRP | stat_mod.S_IWOTH


def stat_signature(st: os.stat_result) -> str:
    """Everything a content change moves: the fingerprint of a file's current version."""
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{st.st_dev}"


class _Row:
    __slots__ = ("size", "mtime", "ctime", "nlink", "digest")

    def __init__(self, size: int, mtime: int, ctime: int, nlink: int, digest: Digest) -> None:
        self.size, self.mtime, self.ctime, self.nlink = size, mtime, ctime, nlink
        self.digest = digest

    def matches(self, st: os.stat_result) -> bool:
        return (self.size, self.mtime, self.ctime) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def only_relinked(self, st: os.stat_result) -> bool:
        """The inode gained or lost a hard link since this row was written, nothing else."""
        return (self.size, self.mtime) == (st.st_size, st.st_mtime_ns) \
            and st.st_nlink != self.nlink and not st.st_mode & _WRITE_BITS


class StatCache:
    """(device, inode) -> digest, valid while the inode's stat is unchanged."""

    def __init__(self, db_path: Path) -> None:
        self._db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self._memo: dict[tuple[int, int], _Row] = {}
        self._writable = True
        self._lock = threading.Lock()  # doit -P thread: one connection, one user at a time
        self._deferring = 0  # inside `deferred`: rows wait in `_pending`
        self._pending: list[tuple] = []
        self.bytes_hashed = 0

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._db_path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self._db_path, timeout=60, isolation_level=None,
                                         check_same_thread=False)
            # A cache: losing the last writes to a crash costs a re-hash, never a wrong
            # answer (the stat must still match), so no fsync per insert.
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=OFF")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS files (dev INTEGER, ino INTEGER, size INTEGER,"
                " mtime_ns INTEGER, ctime_ns INTEGER, nlink INTEGER, digest TEXT, path TEXT,"
                " seen REAL, PRIMARY KEY (dev, ino))")
            self._conn.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        return self._conn

    def digest(self, path: Path | str) -> Digest:
        """The file's SHA-256, hashing it only if its inode changed since last seen."""
        name = os.fspath(path)
        st = os.stat(name)
        known = self._known(name, st)
        if known is not None:
            return known
        digest = sha256_file(Path(name))
        self.bytes_hashed += st.st_size
        self._write(name, digest, st)  # the stat from before: a change while hashing shows
        return digest

    def recorded(self, path: Path | str) -> Digest | None:
        """The digest remembered for the file as it is now; None when it was never hashed
        here or changed since. Nothing is read but the file's stat."""
        name = os.fspath(path)
        return self._known(name, os.stat(name))

    def _known(self, name: str, st: os.stat_result) -> Digest | None:
        row = self._lookup(st)
        if row is None:
            return None
        if row.matches(st):
            return row.digest
        if row.only_relinked(st):
            self._write(name, row.digest, st)
            return row.digest
        return None

    def remember(self, path: Path, digest: Digest, st: os.stat_result | None = None) -> None:
        """Record a digest known by other means (a file just linked from the store)."""
        name = os.fspath(path)
        self._write(name, digest, st if st is not None else os.stat(name))

    def _lookup(self, st: os.stat_result) -> _Row | None:
        ident = (st.st_dev, st.st_ino)
        row = self._memo.get(ident)
        if row is not None:
            return row
        found = self._select(ident)
        if found is not None:
            row = _Row(found[0], found[1], found[2], found[3], Digest(found[4]))
            self._memo[ident] = row
        return row

    def _select(self, ident: tuple[int, int]) -> tuple | None:
        try:
            with self._lock:
                cur = self._db().execute(
                    "SELECT size, mtime_ns, ctime_ns, nlink, digest FROM files"
                    " WHERE dev = ? AND ino = ?", ident)
                return cur.fetchone()
        except sqlite3.Error:
            return None  # an unreadable cache is an empty one

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Rows written meanwhile go to the table in one transaction at the end (a batch
        of downloads: one commit, not one per object; they are in memory at once). A crash
        before the end loses them, which costs a re-hash, never a wrong answer."""
        with self._lock:
            self._deferring += 1
        try:
            yield
        finally:
            with self._lock:
                self._deferring -= 1
                rows = [] if self._deferring else self._pending
                if not self._deferring:
                    self._pending = []
            self._insert(rows)

    def _write(self, name: str, digest: Digest, st: os.stat_result) -> None:
        row = _Row(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink, digest)
        self._memo[(st.st_dev, st.st_ino)] = row
        values = (st.st_dev, st.st_ino, row.size, row.mtime, row.ctime, row.nlink, digest.hex,
                  os.path.abspath(name), time.time())
        with self._lock:
            if self._deferring:
                self._pending.append(values)
                return
        self._insert([values])

    def _insert(self, rows: list[tuple]) -> None:
        if not rows or not self._writable:
            return
        try:
            with self._lock:
                db = self._db()
                if len(rows) == 1:
                    db.execute(_INSERT, rows[0])
                else:
                    with db:  # one transaction
                        db.execute("BEGIN")
                        db.executemany(_INSERT, rows)
        except sqlite3.Error:
            self._writable = False  # read-only or full: go on, remembering in memory only

    # -- bounding the table ----------------------------------------------------------

    def prune(self, now: float | None = None, max_rows: int = MAX_ROWS) -> int:
        """Drop rows whose file is gone or is another inode now; at most once a day."""
        now = time.time() if now is None else now
        try:
            db = self._db()
            last = db.execute("SELECT v FROM meta WHERE k = 'pruned'").fetchone()
            if last is not None and now - float(last[0]) < PRUNE_EVERY_S:
                return 0
            dead = [(dev, ino) for dev, ino, path in
                    db.execute("SELECT dev, ino, path FROM files").fetchall()
                    if not _same_inode(path, dev, ino)]
            db.executemany("DELETE FROM files WHERE dev = ? AND ino = ?", dead)
            db.execute("DELETE FROM files WHERE rowid IN (SELECT rowid FROM files"
                       " ORDER BY seen DESC LIMIT -1 OFFSET ?)", (max_rows,))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('pruned', ?)", (str(now),))
        except sqlite3.Error:
            return 0
        for ident in dead:
            self._memo.pop(ident, None)
        return len(dead)

    def rows(self) -> int:
        return int(self._db().execute("SELECT COUNT(*) FROM files").fetchone()[0])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _same_inode(path: str, dev: int, ino: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)
