"""The HTTP transport (Bazel's cache protocol): one kept-alive connection per thread, an
idle timeout on every socket operation and a deadline on every exchange (timeout + size /
min_rate, enforced by the shared watchdog.py thread); uploads given a digest hashed as they
go, downloads stopped at the size expected. The only module that knows about sockets and
status codes."""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from ..declare.settings import DEFAULT_MIN_RATE, CacheSettings
from . import expect, plain_get
from .body import check_bytes, upload_body
from .overlap import HashingWriter
from .problems import CorruptSource, Oversized, Problem, RemoteError, Sink, SinkError, sunk
from .watchdog import SHARED, Deadline, Watchdog

CHUNK = 1 << 20
# Where a GET's body goes, and the most bytes it may have: a sink fed chunk by chunk, or a
# buffer filled in place (of that many bytes and one more).
Reader = tuple[Sink | memoryview, int | None]


class _NoExpect(Exception):
    """The server answered 417 to `Expect: 100-continue`: the request goes again without."""


def _status_problem(status: int) -> Problem:
    if status in (401, 403):
        return Problem.UNAUTHORIZED
    if status in (413, 507):
        return Problem.FULL
    if status >= 500:
        return Problem.SERVER
    return Problem.PROTOCOL


class HttpTransport:
    """One kept-alive connection per thread; an idle timeout on every socket operation and
    a deadline on every exchange (timeout + size / min_rate)."""

    def __init__(self, settings: CacheSettings) -> None:
        parts = urlsplit(settings.remote or "")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        self._base = parts.path.rstrip("/")
        self._timeout = settings.timeout_s
        self._min_rate = settings.min_rate or DEFAULT_MIN_RATE
        self._headers = {"User-Agent": "hefbuild"} | _auth_header(settings)
        self._ssl = _ssl_context(settings) if self._https else None
        self._local = threading.local()
        self._plain = None if self._https else _plain_get(self._host, self._port, self._headers)
        self._expect = True  # large uploads wait for `100 Continue` (expect.py)
        self.watchdog: Watchdog = SHARED

    def head(self, path: str) -> int | None:
        status, size = self._call("HEAD", path)
        return None if status == 404 else size

    def get(self, path: str, sink: Sink, limit: int | None = None) -> int | None:
        status, size = self._call("GET", path, reader=(sink, limit), size=limit or 0)
        return None if status == 404 else size

    def get_into(self, path: str, into: memoryview,
                 meanwhile: Callable[[], None] | None = None) -> int | None:
        """`get` with the limit len(into) - 1, the bytes read straight into `into`.
        `meanwhile` runs once the request is sent, before the answer is read: local work
        (landing the previous blob) that then overlaps the round trip."""
        limit = len(into) - 1
        status, size = self._call("GET", path, reader=(into, limit), size=limit,
                                  meanwhile=meanwhile)
        return None if status == 404 else size

    def put(self, path: str, body: Path | bytes, digest: str | None = None) -> int:
        size = body.stat().st_size if isinstance(body, Path) else len(body)
        if digest is not None and isinstance(body, bytes):
            check_bytes(body, digest)
        self._call("PUT", path, body=(body, digest), size=size)
        return size

    # The one place that turns sockets and statuses into RemoteError.
    def _call(self, method: str, path: str, body: tuple[Path | bytes, str | None] | None = None,
              reader: Reader | None = None, size: int = 0,
              meanwhile: Callable[[], None] | None = None, plain: bool = True) -> tuple[int, int]:
        deadline: Deadline | None = None
        try:
            conn = self._conn()
            if conn.sock is None:
                conn.connect()
            deadline = self.watchdog.arm(self._timeout + size / self._min_rate, conn.sock)
            url = f"{self._base}/{path}"
            if plain and self._plain is not None and reader is not None \
                    and isinstance(reader[0], memoryview) and plain_get.takes(url):
                answer = self._plain_exchange(self._plain, conn, url, reader[0], meanwhile)
            else:
                answer = self._exchange(conn, method, path, body, reader, meanwhile)
        except _NoExpect:
            self.watchdog.disarm(deadline)
            deadline = None
            return self._call(method, path, body, reader, size)  # once: without the header
        except plain_get.Unusual:
            self._drop()
            self.watchdog.disarm(deadline)
            deadline = None
            # again through http.client; `meanwhile` ran when the first request went
            return self._call(method, path, body, reader, size, plain=False)
        except (CorruptSource, SinkError):
            self._drop()  # the server never sees the rest of the body: it keeps nothing
            raise
        except Exception as exc:
            self._drop()
            raise self._translated(exc, deadline) from exc
        finally:
            if deadline is not None:
                self.watchdog.disarm(deadline)
        if deadline.expired:  # a cut-off body can look complete to http.client
            self._drop()
            raise self._translated(TimeoutError(), deadline)
        return answer

    def _translated(self, exc: Exception, deadline: Deadline | None) -> Exception:
        if deadline is not None and deadline.expired:
            return RemoteError(Problem.TIMEOUT, f"slower than {_rate(self._min_rate)} "
                               f"(cut off after {deadline.seconds:.0f} s)")
        if isinstance(exc, RemoteError):
            return exc
        if isinstance(exc, TimeoutError):
            return RemoteError(Problem.TIMEOUT, f"no answer within {self._timeout:g} s")
        if isinstance(exc, ssl.SSLError):
            return RemoteError(Problem.UNREACHABLE, f"TLS: {exc.reason or exc}")
        if isinstance(exc, (http.client.HTTPException, ConnectionError)):
            return RemoteError(Problem.UNREACHABLE, type(exc).__name__, status=-1)
        if isinstance(exc, OSError):
            return RemoteError(Problem.UNREACHABLE, exc.strerror or type(exc).__name__)
        return exc

    def _plain_exchange(self, plain: plain_get.PlainGet, conn: http.client.HTTPConnection,
                        url: str, into: memoryview,
                        meanwhile: Callable[[], None] | None) -> tuple[int, int]:
        assert conn.sock is not None
        status, got, announced, keep = plain.get(conn.sock, url, into, meanwhile)
        if not keep:
            self._drop()
        if status == 404:
            return 404, 0
        if not 200 <= status < 300:
            raise RemoteError(_status_problem(status), f"HTTP {status} on GET", status)
        return status, _complete(got, announced)

    def _exchange(self, conn: http.client.HTTPConnection, method: str, path: str,
                  body: tuple[Path | bytes, str | None] | None,
                  reader: Reader | None,
                  meanwhile: Callable[[], None] | None = None) -> tuple[int, int]:
        headers = dict(self._headers)
        url = f"{self._base}/{path}"
        if body is None:
            conn.request(method, url, headers=headers)
            if meanwhile is not None:
                meanwhile()
        elif isinstance(body[0], bytes):
            headers["Content-Length"] = str(len(body[0]))
            conn.request(method, url, body=body[0], headers=headers)
        else:
            with open(body[0], "rb") as f, upload_body(f, body[1], self._buffer()) as source:
                size = os.fstat(f.fileno()).st_size
                headers["Content-Length"] = str(size)
                if size < expect.FROM or not self._expect:
                    conn.request(method, url, body=source, headers=headers)
                elif self._go_on(conn, method, url, headers):
                    conn.send(source)
        return self._answer(method, conn.getresponse(), reader)

    def _go_on(self, conn: http.client.HTTPConnection, method: str, url: str,
               headers: dict[str, str]) -> bool:
        """The headers of a large upload, then the server's go (expect.py); a refusal
        before the body is raised as the status it is."""
        status = expect.send_headers_expecting(conn, method, url, headers)
        if status is None:
            return True
        self._drop()  # the server answered a request whose body it never got
        if status == 417:  # it does not take the header: this and later uploads go without
            self._expect = False
            raise _NoExpect
        problem = Problem.PROTOCOL if 200 <= status < 300 else _status_problem(status)
        raise RemoteError(problem, f"HTTP {status} on {method}, before the body", status)

    def _answer(self, method: str, resp: http.client.HTTPResponse,
                reader: Reader | None) -> tuple[int, int]:
        status = resp.status
        if status == 404 and method in ("GET", "HEAD"):
            resp.read()
            return 404, 0
        if not 200 <= status < 300:
            resp.read()
            raise RemoteError(_status_problem(status), f"HTTP {status} on {method}", status)
        if method == "HEAD":
            resp.read()  # no body; frees the connection for the next request
            return status, _length(resp)
        if reader is None:
            resp.read()
            return status, 0
        into, limit = reader
        if isinstance(into, memoryview):
            return status, _fill(resp, into)
        return status, _drain(resp, into, limit)

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

    def _buffer(self) -> bytearray:
        """This thread's buffer for the bodies it sends (one request at a time a thread)."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(CHUNK)
        return buf

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _plain_get(host: str, port: int | None, headers: dict[str, str]) -> plain_get.PlainGet | None:
    """What http.client would send as the Host field, for plain_get.py; None when a header
    has a line break (http.client then refuses the request, as it should)."""
    host = f"[{host}]" if ":" in host else host
    try:
        return plain_get.PlainGet(host if port in (None, 80) else f"{host}:{port}", headers)
    except ValueError:
        return None


def _length(resp: http.client.HTTPResponse) -> int:
    try:
        return int(resp.getheader("Content-Length", "-1"))
    except ValueError:
        return -1


def _announced(resp: http.client.HTTPResponse, limit: int | None) -> int:
    announced = _length(resp)
    if limit is not None and announced > limit:
        resp.close()
        raise Oversized(limit, f"answer of {announced} bytes, more than the {limit} "
                        f"expected")
    return announced


def _complete(total: int, announced: int) -> int:
    if announced >= 0 and total != announced:
        raise RemoteError(Problem.UNREACHABLE, f"connection closed after {total} of "
                          f"{announced} bytes", status=-1)
    return total


def _fill(resp: http.client.HTTPResponse, into: memoryview) -> int:
    """The body into `into`, which has room for one byte more than the body may have: a
    body that fills it is too long, and refused."""
    limit = len(into) - 1
    announced = _announced(resp, limit)
    total = 0
    while total < len(into) and (n := resp.readinto(into[total:])):
        total += n
    if total > limit:
        resp.close()
        raise Oversized(limit, f"answer larger than the {limit} bytes expected")
    return _complete(total, announced)


def _drain(resp: http.client.HTTPResponse, sink: Sink, limit: int | None) -> int:
    announced = _announced(resp, limit)
    if isinstance(sink, HashingWriter) and sink.overlapped:
        return _complete(_refill(resp, sink, limit), announced)
    buf = bytearray(CHUNK if limit is None else max(1, min(CHUNK, limit + 1)))
    view = memoryview(buf)
    total = 0
    while n := resp.readinto(buf):
        total += n
        _within(resp, total, limit)
        sunk(sink, view[:n])  # the sink consumes it before the next read
    return _complete(total, announced)


def _refill(resp: http.client.HTTPResponse, sink: HashingWriter, limit: int | None) -> int:
    """The body received straight into the hashing ring's buffers (`take` waits while the
    hash is behind), one copy fewer than a chunk handed over."""
    total = 0
    while n := resp.readinto(buf := sink.take()):
        total += n
        _within(resp, total, limit)
        sunk(sink.filled, buf, n)
    return total


def _within(resp: http.client.HTTPResponse, total: int, limit: int | None) -> None:
    if limit is not None and total > limit:
        resp.close()
        raise Oversized(limit, f"answer larger than the {limit} bytes expected")


def _rate(bytes_per_s: int) -> str:
    return f"{bytes_per_s / (1 << 20):g} MiB/s" if bytes_per_s >= 1 << 20 else \
        f"{bytes_per_s / 1024:g} KiB/s"


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
