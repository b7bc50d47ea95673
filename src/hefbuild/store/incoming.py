"""An object on its way into the store: its bytes go to a file that has no name yet, made in
the folder the object will live in (O_TMPFILE), and it gets its name by a link only once the
caller has checked that the bytes are the digest. Abandoned, or its process killed on the way,
it leaves nothing behind: the kernel frees a file without a name when its last descriptor
closes, so there is nothing for a later run to trust or to sweep.

Why: downloads of many small blobs made each one as a named temp file in the one `tmp/`
folder and renamed it into its shard. Every create and every rename takes that folder's lock,
and with four connections landing at once the kernel spent about a tenth of the download's
CPU spinning on it (`perf`: `rwsem_spin_on_owner` under `lock_two_directories` and
`path_openat`). Unnamed files in the shard folders take no shared lock until the link, and
the shards are many. Measured on 200 x 1 MiB blobs from nginx on loopback, 21 shuffled
rounds: 4 at once 11 % faster, one at a time 6 %.

Where the filesystem has no O_TMPFILE (NFS, old kernels) or /proc is not mounted, a named
temp file in `tmp/` (`incoming-<pid>-…`, swept once its process is gone) is renamed into
place, as before. Publishing replaces an object already there: a fresh, verified copy wins
over one that was found damaged.
"""

from __future__ import annotations

import errno
import functools
import os
import secrets
import tempfile
from pathlib import Path
from typing import IO

from .piecefile import PieceFile

_PROC_FD = "/proc/self/fd"
# What open(O_TMPFILE) answers where the filesystem or the kernel cannot make unnamed files.
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)


@functools.cache
def _proc_mounted() -> bool:
    """Whether a file's descriptor can be linked through /proc (asked once a process: a
    download of 200 blobs asked 200 times)."""
    return os.path.isdir(_PROC_FD)


class Incoming:
    """`out` takes the object's bytes (unbuffered, in pieces: piecefile.py); `publish()`
    gives them the name `dest`, read-only. Use it in a `with`: leaving without `publish()`
    keeps nothing."""

    def __init__(self, dest: Path, tmp: Path) -> None:
        self.dest, self._tmp = dest, tmp
        self._named: Path | None = None  # the fallback's temp file
        self.out: IO[bytes] = self._unnamed() or self._named_temp()

    def _unnamed(self) -> IO[bytes] | None:
        if not _proc_mounted():
            return None
        try:
            fd = os.open(self.dest.parent, os.O_TMPFILE | os.O_WRONLY, 0o444)
        except FileNotFoundError:  # the first object of its shard: make the shard, once
            self.dest.parent.mkdir(parents=True, exist_ok=True)
            return self._unnamed()
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                return None
            raise
        return PieceFile(fd, "wb")

    def _named_temp(self) -> IO[bytes]:
        fd, tmp = tempfile.mkstemp(dir=self._tmp, prefix=f"incoming-{os.getpid()}-")
        self._named = Path(tmp)
        return PieceFile(fd, "wb")

    def publish(self) -> None:
        """The bytes written, under `dest` (made read-only for everyone, whatever the
        umask), atomically: a reader sees the old object or the new one, never a part."""
        self.out.flush()
        os.fchmod(self.out.fileno(), 0o444)
        if self._named is not None:
            self._rename(self._named)
            self._named = None
            return
        try:
            self._link(self.dest)
        except FileExistsError:  # replace it, in one rename, through a name in tmp/
            tmp = self._tmp / f"incoming-{os.getpid()}-{secrets.token_hex(8)}"
            self._link(tmp)
            self._rename(tmp)

    def _link(self, name: Path) -> None:
        # The folder's descriptor makes os.link call linkat, which follows the /proc link
        # to the open file (plain link() would try to link the /proc entry itself).
        folder = os.open(name.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            os.link(f"{_PROC_FD}/{self.out.fileno()}", name.name, dst_dir_fd=folder)
        finally:
            os.close(folder)

    def _rename(self, tmp: Path) -> None:
        try:
            os.replace(tmp, self.dest)
        except FileNotFoundError:
            if not tmp.exists():
                raise
            self.dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, self.dest)

    def close(self) -> None:
        self.out.close()
        if self._named is not None:
            self._named.unlink(missing_ok=True)
            self._named = None

    def __enter__(self) -> Incoming:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
