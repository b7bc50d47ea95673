"""An HTTP server on 127.0.0.1 that answers each request with the next raw answer of a script.

For the corners of a client's HTTP that real servers rarely show: a head in pieces, a
chunked body, `Connection: close`, HTTP/1.0. `ScriptedServer(answers)` records every
request as (connection number, the request's head bytes) in `requests`; an answer is
`(bytes, how)` with how "whole" (sent at once), "pieces" (the head a byte a write, then
the body in 7 writes, with a short pause after each) or "close" (sent whole, then the
connection closed). After the script, it closes. With `tls` (a server context), it speaks
HTTPS.
"""

from __future__ import annotations

import itertools
import socket
import ssl
import threading
import time
from types import TracebackType


class ScriptedServer:
    def __init__(self, answers: list[tuple[bytes, str]],
                 tls: ssl.SSLContext | None = None) -> None:
        self.answers = list(answers)
        self._tls = tls
        self.requests: list[tuple[int, bytes]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        scheme = "https" if self._tls else "http"
        return f"{scheme}://127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> ScriptedServer:
        self._listener.settimeout(0.05)
        self._spawn(self._accept)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._listener.close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _spawn(self, target, *args) -> None:  # noqa: ANN001
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        number = 0
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            number += 1
            if self._tls is not None:
                conn.settimeout(5)
                try:
                    conn = self._tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    conn.close()
                    continue
            self._spawn(self._serve, conn, number)

    def _serve(self, conn: socket.socket, number: int) -> None:
        conn.settimeout(0.05)
        pending = b""
        with conn:
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                pending += chunk
                while b"\r\n\r\n" in pending:
                    head, _, pending = pending.partition(b"\r\n\r\n")
                    with self._lock:
                        self.requests.append((number, head + b"\r\n\r\n"))
                        answer = self.answers.pop(0) if self.answers else None
                    if answer is None or not self._answer(conn, *answer):
                        return

    def _answer(self, conn: socket.socket, data: bytes, how: str) -> bool:
        """Sends one answer; False when the connection is to close after it."""
        if how == "pieces":
            body = data.find(b"\r\n\r\n") + 4
            step = max(1, (len(data) - body) // 7)
            cuts = [*range(body + 1), *range(body + step, len(data), step), len(data)]
            for start, end in itertools.pairwise(cuts):
                conn.sendall(data[start:end])
                time.sleep(0.002)
        else:
            conn.sendall(data)
        return how != "close"
