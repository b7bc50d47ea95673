"""A shared folder (NFS) as the remote cache: the same layout as the HTTP cache, every
write a temp file renamed into place."""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path

from ..store.piecefile import PieceFile
from .problems import CorruptSource, Oversized, Problem, RemoteError, Sink, sunk

CHUNK = 1 << 20


class FolderTransport:
    """The same layout in a folder; every write is a temp file renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def head(self, path: str) -> int | None:
        self._check_root()
        try:
            st = (self.root / path).stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _folder_error(exc) from exc
        return st.st_size if os.path.isfile(self.root / path) else None

    def get(self, path: str, sink: Sink, limit: int | None = None) -> int | None:
        self._check_root()
        try:
            with open(self.root / path, "rb") as f:
                total = 0
                while chunk := f.read(CHUNK):
                    total += len(chunk)
                    if limit is not None and total > limit:
                        raise Oversized(limit, f"entry larger than the {limit} bytes "
                                        f"expected")
                    sunk(sink, chunk)
                return total
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _folder_error(exc) from exc

    def put(self, path: str, body: Path | bytes, digest: str | None = None) -> int:
        self._check_root()
        dest = self.root / path
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".incoming-")
            try:
                size = _write_all(fd, body, digest)
                os.replace(tmp, dest)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise _folder_error(exc) from exc
        return size

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise RemoteError(Problem.UNREACHABLE, "the shared folder does not exist")


def _write_all(fd: int, body: Path | bytes, digest: str | None) -> int:
    hasher = hashlib.sha256()
    with PieceFile(fd, "wb") as out:
        if isinstance(body, bytes):
            out.write(body)
            hasher.update(body)
            size = len(body)
        else:
            with open(body, "rb") as src:
                size = 0
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    hasher.update(chunk)
                    size += len(chunk)
        if digest is not None and hasher.hexdigest() != digest:
            raise CorruptSource(digest, hasher.hexdigest())
        out.flush()
        os.fsync(out.fileno())
    return size


def _folder_error(exc: OSError) -> RemoteError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return RemoteError(Problem.FULL, exc.strerror or "no space left")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return RemoteError(Problem.UNAUTHORIZED, exc.strerror or "permission denied")
    return RemoteError(Problem.UNREACHABLE, exc.strerror or type(exc).__name__)
