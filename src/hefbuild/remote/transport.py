"""Moving bytes to and from a remote cache: HTTP (Bazel's cache protocol) or a shared folder.

Both transports speak in cache paths (`cas/<sha256>`, `ac/<key>`) and stream: a blob is
never held whole in memory. Every failure becomes a `RemoteError` with a `Problem` that
says what a person should hear (not authorized is not "cannot reach"); the HTTP layer is
the only place that knows about sockets and status codes.

    RemoteError
     ├── problem = UNREACHABLE   connection refused, DNS, TLS, a shared folder missing
     ├── problem = TIMEOUT       no byte within the idle timeout
     ├── problem = UNAUTHORIZED  401 / 403, or a folder we may not write
     ├── problem = FULL          413 / 507, or no space left
     ├── problem = SERVER        5xx
     └── problem = PROTOCOL      any other answer we cannot use
"""

from __future__ import annotations

import base64
import errno
import http.client
import os
import ssl
import tempfile
import threading
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from ..settings import CacheSettings

CHUNK = 1 << 20
Sink = Callable[[bytes | memoryview], None]


class Problem(str, Enum):
    UNREACHABLE = "cannot be reached"
    TIMEOUT = "did not answer in time"
    UNAUTHORIZED = "not authorized"
    FULL = "is full or refused the size"
    SERVER = "answered with a server error"
    PROTOCOL = "gave an unexpected answer"


class RemoteError(Exception):
    def __init__(self, problem: Problem, detail: str, status: int | None = None) -> None:
        super().__init__(f"{problem.value} ({detail})")
        self.problem, self.detail, self.status = problem, detail, status

    @property
    def transient(self) -> bool:
        """Worth one more try: a dropped connection or a 502/503/504."""
        return (self.problem is Problem.SERVER and self.status in (502, 503, 504)) or \
            (self.problem is Problem.UNREACHABLE and self.status == -1)


class Transport(Protocol):
    def head(self, path: str) -> bool: ...
    def get(self, path: str, sink: Sink, limit: int | None = None) -> int | None: ...
    def put(self, path: str, body: Path | bytes) -> int: ...


def transport_for(settings: CacheSettings) -> Transport:
    assert settings.remote is not None
    if settings.remote.startswith("file://"):
        return FolderTransport(Path(settings.remote.removeprefix("file://")))
    return HttpTransport(settings)


# -- HTTP ------------------------------------------------------------------------------


def _status_problem(status: int) -> Problem:
    if status in (401, 403):
        return Problem.UNAUTHORIZED
    if status in (413, 507):
        return Problem.FULL
    if status >= 500:
        return Problem.SERVER
    return Problem.PROTOCOL


class HttpTransport:
    """One kept-alive connection per thread; idle timeout on every socket operation."""

    def __init__(self, settings: CacheSettings) -> None:
        parts = urlsplit(settings.remote or "")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        self._base = parts.path.rstrip("/")
        self._timeout = settings.timeout_s
        self._headers = {"User-Agent": "hefbuild"} | _auth_header(settings)
        self._ssl = _ssl_context(settings) if self._https else None
        self._local = threading.local()

    def head(self, path: str) -> bool:
        status, _ = self._call("HEAD", path, None, None)
        return status == 200

    def get(self, path: str, sink: Sink, limit: int | None = None) -> int | None:
        status, size = self._call("GET", path, None, (sink, limit))
        return None if status == 404 else size

    def put(self, path: str, body: Path | bytes) -> int:
        size = body.stat().st_size if isinstance(body, Path) else len(body)
        self._call("PUT", path, body, None)
        return size

    # The one place that turns sockets and statuses into RemoteError.
    def _call(self, method: str, path: str, body: Path | bytes | None,
              reader: tuple[Sink, int | None] | None) -> tuple[int, int]:
        try:
            return self._exchange(method, path, body, reader)
        except RemoteError:
            self._drop()
            raise
        except TimeoutError as exc:
            self._drop()
            raise RemoteError(Problem.TIMEOUT, f"no answer within {self._timeout:g} s") from exc
        except ssl.SSLError as exc:
            self._drop()
            raise RemoteError(Problem.UNREACHABLE, f"TLS: {exc.reason or exc}") from exc
        except (http.client.HTTPException, ConnectionError) as exc:
            self._drop()
            raise RemoteError(Problem.UNREACHABLE, type(exc).__name__, status=-1) from exc
        except OSError as exc:
            self._drop()
            raise RemoteError(Problem.UNREACHABLE, exc.strerror or type(exc).__name__) from exc

    def _exchange(self, method: str, path: str, body: Path | bytes | None,
                  reader: tuple[Sink, int | None] | None) -> tuple[int, int]:
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Length"] = str(body.stat().st_size if isinstance(body, Path)
                                            else len(body))
        conn = self._conn()
        if isinstance(body, Path):
            with open(body, "rb") as f:
                conn.request(method, f"{self._base}/{path}", body=f, headers=headers)
                resp = conn.getresponse()
        else:
            conn.request(method, f"{self._base}/{path}", body=body, headers=headers)
            resp = conn.getresponse()
        return self._answer(method, resp, reader)

    def _answer(self, method: str, resp: http.client.HTTPResponse,
                reader: tuple[Sink, int | None] | None) -> tuple[int, int]:
        status = resp.status
        if status == 404 and method in ("GET", "HEAD"):
            resp.read()
            return 404, 0
        if not 200 <= status < 300:
            resp.read()
            raise RemoteError(_status_problem(status), f"HTTP {status} on {method}", status)
        if reader is None:
            resp.read()
            return status, 0
        return status, _drain(resp, *reader)

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout,
                                                   context=self._ssl, blocksize=CHUNK)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout,
                                                  blocksize=CHUNK)
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _drain(resp: http.client.HTTPResponse, sink: Sink, limit: int | None) -> int:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    while n := resp.readinto(buf):
        total += n
        if limit is not None and total > limit:
            resp.close()
            raise RemoteError(Problem.PROTOCOL, f"answer larger than {limit} bytes")
        sink(view[:n])  # the sink consumes it before the next read
    return total


def _auth_header(settings: CacheSettings) -> dict[str, str]:
    creds = settings.credentials
    if creds.token:
        return {"Authorization": f"Bearer {creds.token}"}
    if creds.user:
        pair = f"{creds.user}:{creds.password or ''}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
    return {}


def _ssl_context(settings: CacheSettings) -> ssl.SSLContext:
    cafile = str(settings.ca_bundle) if settings.ca_bundle else None
    return ssl.create_default_context(cafile=cafile)


# -- a shared folder (NFS) ---------------------------------------------------------------


class FolderTransport:
    """The same layout in a folder; every write is a temp file renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def head(self, path: str) -> bool:
        self._check_root()
        return (self.root / path).is_file()

    def get(self, path: str, sink: Sink, limit: int | None = None) -> int | None:
        self._check_root()
        try:
            with open(self.root / path, "rb") as f:
                total = 0
                while chunk := f.read(CHUNK):
                    total += len(chunk)
                    if limit is not None and total > limit:
                        raise RemoteError(Problem.PROTOCOL, f"entry larger than {limit} bytes")
                    sink(chunk)
                return total
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _folder_error(exc) from exc

    def put(self, path: str, body: Path | bytes) -> int:
        self._check_root()
        dest = self.root / path
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".incoming-")
            try:
                size = _write_all(fd, body)
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


def _write_all(fd: int, body: Path | bytes) -> int:
    with os.fdopen(fd, "wb") as out:
        if isinstance(body, bytes):
            out.write(body)
            size = len(body)
        else:
            with open(body, "rb") as src:
                size = 0
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return size


def _folder_error(exc: OSError) -> RemoteError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return RemoteError(Problem.FULL, exc.strerror or "no space left")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return RemoteError(Problem.UNAUTHORIZED, exc.strerror or "permission denied")
    return RemoteError(Problem.UNREACHABLE, exc.strerror or type(exc).__name__)
