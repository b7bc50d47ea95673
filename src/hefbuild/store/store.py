"""The content-addressed store: output files by digest, and action key -> result records.

On-disk layout (format v1), under the store root:

    v1/objects/<d[:2]>/<d[2:]>   one file per content digest, read-only (0444)
    v1/results/<k[:2]>/<k>.json  one record per action key (see `Record`)
    v1/tmp/                      scratch dirs and temp files; same filesystem, so every
                                 publish is a rename or a link, atomic (a download is an
                                 unnamed file in its shard until checked: incoming.py)
    v1/locks/<k[:2]>/<k>.lock    held (flock) by the one process building key k, so two
                                 builders of one key build it once
    v1/projects/<id>.json        the projects whose build/ links objects (for `doit gc`)
    v1/uploads/<r>/<k>           result k is still to be uploaded to remote cache r
                                 (store/upload_queue.py)
    v1/gc.lock                   shared by writers, exclusive for `doit gc`

A record's mtime is its last use (build, restore, remote fetch): `doit gc` drops the
least recently used first.

Invariants: an object's name is the SHA-256 of its bytes; a record is written only after
every object it names is in place, so a crash at any point leaves either no record or a
complete one. An object whose bytes no longer match its name (checked when it is read,
cheaply via the stat cache) is deleted and its record treated as a miss.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..digest import Digest, sha256_file
from ..errors import StoreError
from .incoming import Incoming
from .piecefile import PieceFile

if TYPE_CHECKING:  # sqlite3 only where a store is used, not on a no-op
    from .statcache import StatCache

STORE_FORMAT = "v1"


@dataclass(frozen=True)
class OutputFile:
    digest: str
    size: int


@dataclass(frozen=True)
class Record:
    key: str
    stage: str
    outputs: dict[str, OutputFile]  # path relative to the stage dir -> content
    log: str  # digest of the build log object
    toolchain: dict[str, Any]
    seconds: float
    peak_rss_mb: float
    description: dict[str, Any] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    finished_at: float = 0.0  # unix time the rule finished (the remote entry's metadata)
    sandbox: str = ""  # how the rule was isolated: "bwrap", "docker", "none"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Record:
        raw = json.loads(text)
        raw["outputs"] = {k: OutputFile(**v) for k, v in raw["outputs"].items()}
        return cls(**raw)


class Store:
    def __init__(self, root: Path, stats: StatCache) -> None:
        self.root = root / STORE_FORMAT
        self._stats = stats
        self._made = False

    def _dirs(self) -> None:
        # Once per Store: a download of many small blobs paid three mkdir calls for each.
        if self._made:
            return
        try:
            for sub in ("objects", "results", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"store {self.root.parent} is not writable: {exc.strerror}") from exc
        self._made = True

    def object_path(self, digest: str) -> Path:
        return self.root / "objects" / digest[:2] / digest[2:]

    def _record_path(self, key: str) -> Path:
        return self.root / "results" / key[:2] / f"{key}.json"

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A private dir on the store's filesystem, removed afterwards whatever happens."""
        self._dirs()
        path = Path(tempfile.mkdtemp(prefix=f"scratch-{os.getpid()}-", dir=self.root / "tmp"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    # -- writing ---------------------------------------------------------------------

    def put_file(self, path: Path) -> OutputFile:
        """Move a finished file into the objects (it is consumed); returns its content."""
        self._dirs()
        digest = sha256_file(path)
        st = path.stat()
        dest = self.object_path(digest.hex)
        if not self.verify(digest.hex):
            dest.parent.mkdir(parents=True, exist_ok=True)
            if st.st_nlink > 1:
                # A hard link to a file elsewhere (a rule that linked a project file as
                # its output): never chmod or adopt someone else's inode; store a copy.
                os.replace(self._temp_copy(path), dest)
            else:
                os.chmod(path, 0o444)
                try:
                    os.replace(path, dest)
                except OSError:  # scratch on another filesystem: copy, publish by rename
                    os.replace(self._temp_copy(path), dest)
            self._stats.remember(dest, digest)
        return OutputFile(digest.hex, st.st_size)

    def put_bytes(self, data: bytes) -> OutputFile:
        self._dirs()
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        with PieceFile(fd, "wb") as f:
            f.write(data)
        return self.put_file(Path(tmp))

    def _temp_copy(self, path: Path) -> Path:
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        os.close(fd)
        shutil.copyfile(path, tmp)
        os.chmod(tmp, 0o444)
        return Path(tmp)

    def incoming(self, digest: str) -> Incoming:
        """The object `digest` being written (by a download), in a `with`: `adopt` it once
        its bytes are checked; otherwise nothing of it remains (incoming.py)."""
        self._dirs()
        return Incoming(self.object_path(digest), self.root / "tmp")

    def adopt(self, new: Incoming, digest: str) -> None:
        """Publish an incoming object whose SHA-256 the caller computed as it was written."""
        new.publish()
        # The open file's own stat, taken after its link: no walk of the object's path.
        self._stats.remember(new.dest, Digest(digest), os.fstat(new.out.fileno()))

    def batch(self) -> AbstractContextManager[None]:
        """Many objects put at once: their stat-cache rows are written in one transaction."""
        return self._stats.deferred()

    def put_verified_bytes(self, data: bytes | memoryview, digest: str) -> None:
        """Adopt bytes whose SHA-256 the caller just computed."""
        with self.incoming(digest) as new:
            new.out.write(data)
            self.adopt(new, digest)

    def touch(self, key: str) -> None:
        """Mark a record as used now (least recently used records are collected first)."""
        with suppress(OSError):
            os.utime(self._record_path(key))

    @contextmanager
    def building(self, key: str, on_wait: Callable[[], None]) -> Iterator[None]:
        """Held while one process builds `key`; a second builder waits, then finds it."""
        path = self.root / "locks" / key[:2] / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                on_wait()
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def put_record(self, record: Record) -> None:
        """Publish a record; its objects must already be in place."""
        dest = self._record_path(record.key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(record.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)

    # -- reading ---------------------------------------------------------------------

    def get_record(self, key: str) -> Record | None:
        path = self._record_path(key)
        try:
            return Record.from_json(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError):
            with suppress(OSError):
                path.unlink()  # unreadable record: a miss, and gone
            return None

    def has_record(self, key: str) -> bool:
        return self._record_path(key).is_file()

    def drop_object(self, digest: str) -> None:
        """Remove an object found corrupt (its records then fail `intact` and are dropped)."""
        with suppress(OSError):
            self.object_path(digest).unlink()

    def drop_record(self, key: str) -> None:
        """Forget a result (a corrupt one: a miss either way, so a read-only store is fine)."""
        with suppress(OSError):
            self._record_path(key).unlink()

    def verify(self, digest: str) -> bool:
        """True when the object exists and its bytes match its name; a bad one is deleted."""
        path = self.object_path(digest)
        try:
            actual = self._stats.digest(path)
        except FileNotFoundError:
            return False
        if actual == Digest(digest):
            return True
        with suppress(OSError):
            path.unlink()
        return False

    def vouched(self, digest: str) -> bool:
        """The object is there and the stat cache saw it hash to `digest` as it is now (the
        trust a restore gives it): nothing is read. False for one never hashed here or
        changed since, which a caller must hash."""
        try:
            return self._stats.recorded(self.object_path(digest)) == Digest(digest)
        except FileNotFoundError:
            return False

    def present(self, record: Record) -> bool:
        """Every object of the record there (not re-hashed: an upload hashes any object the
        stat cache does not vouch for as it sends it)."""
        return all(self.object_path(d).is_file() for d in _digests(record))

    def intact(self, record: Record) -> bool:
        """Every object of the record present and verified (corrupt ones are removed)."""
        return all([self.verify(d) for d in _digests(record)])  # verify all: prune every bad one

    def sweep_stale(self) -> int:
        """Remove scratch folders and downloads of processes that are gone (kill -9)."""
        removed = 0
        for entry in (self.root / "tmp").glob("*-*-*"):
            kind, _, rest = entry.name.partition("-")
            pid = rest.partition("-")[0]
            if kind in ("scratch", "incoming") and pid.isdigit() and not _alive(int(pid)):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed += 1
        return removed

    def copy_out(self, digest: str, dest: Path) -> None:
        """A read-only copy of an object (for files build/ must not share with the store)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.object_path(digest), dest)
        os.chmod(dest, 0o444)
        self._stats.remember(dest, Digest(digest))

    def materialize(self, digest: str, dest: Path) -> None:
        """Hard-link (or copy across filesystems) one object to `dest`, read-only."""
        src = self.object_path(digest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copyfile(src, dest)
            os.chmod(dest, 0o444)
        # One row per inode: the link's row is the object's, with the ctime linking gave it.
        self._stats.remember(dest, Digest(digest))


def _digests(record: Record) -> list[str]:
    return [o.digest for o in record.outputs.values()] + [record.log]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_staging(build: Path) -> int:
    """Staging folders (`build/<model>/.<stage>.new-PID`, `.old-PID`) of dead processes."""
    removed = 0
    for entry in build.glob("*/.*.*-*"):
        pid = entry.name.rpartition("-")[2]
        if entry.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed
