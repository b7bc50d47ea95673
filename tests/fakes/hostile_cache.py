"""A Bazel-style HTTP cache on 127.0.0.1 that stores honestly and can be told to misbehave.

`HostileCache` is a real HTTP/1.1 server (the stdlib's ThreadingHTTPServer, keep-alive): PUT
stores the body under `data/<path>`, GET and HEAD serve it back (404 when absent), like
nginx with WebDAV. `misbehave(path, how)` changes what one entry's GET answers:

    "endless"   200 with no length, then zeros without end (until the client hangs up)
    "trickle"   the true bytes with their true length, one byte every `trickle_s`
    "oversize"  the true bytes plus `extra` more, with a Content-Length that says so
    "stall"     the true length, the first half of the bytes, then silence (until stopped)
    "cut"       the true length, the first half of the bytes, then the connection closed

Every request is logged as (method, path) in `requests`. `delay_s` holds every `cas/` request
that long before it is answered, and `max_in_flight[method]` says how many `cas/` requests of
a method were being answered at once at most. `stop()` ends the server thread and every
handler (a streaming handler notices within one write).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

CHUNK = 1 << 16


class HostileCache:
    def __init__(self, root: Path, trickle_s: float = 0.3, extra: int = 1 << 20) -> None:
        self.data = root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.trickle_s, self.extra = trickle_s, extra
        self.behaviour: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []
        self.streamed: dict[str, int] = {}  # path -> bytes a misbehaving GET sent
        self.stopping = threading.Event()
        self.delay_s = 0.0
        self.max_in_flight: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def enter(self, method: str, path: str) -> None:
        if not path.lstrip("/").startswith("cas/"):
            return
        with self._lock:
            self._in_flight[method] = self._in_flight.get(method, 0) + 1
            self.max_in_flight[method] = max(self.max_in_flight.get(method, 0),
                                             self._in_flight[method])
        self.stopping.wait(self.delay_s)

    def leave(self, method: str, path: str) -> None:
        if path.lstrip("/").startswith("cas/"):
            with self._lock:
                self._in_flight[method] -= 1

    def misbehave(self, path: str, how: str) -> None:
        assert how in ("endless", "trickle", "oversize", "stall", "cut"), how
        self.behaviour[path.lstrip("/")] = how

    def start(self) -> HostileCache:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> HostileCache:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _handler(cache: HostileCache) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def _file(self) -> Path:
            return cache.data / self.path.lstrip("/")

        def _counted(self, serve: Callable[[], None]) -> None:
            cache.enter(self.command, self.path)
            try:
                serve()
            finally:
                cache.leave(self.command, self.path)

        def do_PUT(self) -> None:  # noqa: N802
            self._counted(self._put)

        def do_HEAD(self) -> None:  # noqa: N802
            self._counted(self._head)

        def do_GET(self) -> None:  # noqa: N802
            self._counted(self._get)

        def _put(self) -> None:
            cache.requests.append(("PUT", self.path))
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self._file().parent.mkdir(parents=True, exist_ok=True)
            self._file().write_bytes(body)
            self._reply(201, b"")

        def _head(self) -> None:
            cache.requests.append(("HEAD", self.path))
            if not self._file().is_file():
                self._reply(404, b"", body=False)
                return
            self._reply(200, self._file().read_bytes(), body=False)

        def _get(self) -> None:
            cache.requests.append(("GET", self.path))
            if not self._file().is_file():
                self._reply(404, b"")
                return
            data = self._file().read_bytes()
            how = cache.behaviour.get(self.path.lstrip("/"))
            try:
                if how == "endless":
                    self._endless()
                elif how == "trickle":
                    self._trickle(data)
                elif how == "oversize":
                    self._reply(200, data + b"\0" * cache.extra)
                elif how in ("stall", "cut"):
                    self._half(data, stall=how == "stall")
                else:
                    self._reply(200, data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _reply(self, status: int, data: bytes, body: bool = True) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _endless(self) -> None:
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            zeros = b"\0" * CHUNK
            while not cache.stopping.is_set():
                self.wfile.write(zeros)
                cache.streamed[self.path] = cache.streamed.get(self.path, 0) + CHUNK

        def _half(self, data: bytes, stall: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            cache.streamed[self.path] = len(data) // 2
            self.close_connection = True
            if stall:
                cache.stopping.wait()

        def _trickle(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for i in range(len(data)):
                if cache.stopping.wait(cache.trickle_s):
                    return
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                cache.streamed[self.path] = i + 1

    return Handler
