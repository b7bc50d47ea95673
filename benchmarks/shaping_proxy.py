"""A TCP proxy on 127.0.0.1 that shapes the link to a server: a rate shared by every
connection in each direction (a token bucket, like one network link) and a fixed one-way
delay on every chunk (half the round trip). The kernel here has no `netem`; this stands in
for it, and both contenders of a benchmark go through the same one.

    with ShapingProxy(("127.0.0.1", 8080), rate=100e6, rtt_s=0.020) as proxy:
        url = f"http://127.0.0.1:{proxy.port}"

The proxy runs in a process of its own (this file as a script), as a real link would be
outside both contenders: threads in the benchmark's process would take the GIL from the
Python contender and not from curl.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time
from types import TracebackType

CHUNK = 1 << 16


class Link:
    """One direction of the link: bytes leave no faster than `rate` per second."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._next_free = 0.0
        self._lock = threading.Lock()

    def send_at(self, n: int, ready: float) -> float:
        """When `n` bytes that are ready at `ready` have left the link."""
        with self._lock:
            start = max(ready, self._next_free)
            self._next_free = start + n / self.rate
            return self._next_free


class ShapingProxy:
    """The proxy in a child process: `start` returns once it listens, `stop` ends it by PID."""

    def __init__(self, upstream: tuple[str, int], rate: float, rtt_s: float) -> None:
        self._args = [upstream[0], str(upstream[1]), repr(rate), repr(rtt_s)]
        self._child: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> ShapingProxy:
        self._child = subprocess.Popen([sys.executable, __file__, *self._args],
                                       stdout=subprocess.PIPE, text=True)
        line = self._child.stdout.readline() if self._child.stdout else ""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"shaping proxy did not start (said {line!r})")
        self.port = int(line)
        return self

    def stop(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            if self._child.stdout:
                self._child.stdout.close()
            self._child = None

    def __enter__(self) -> ShapingProxy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class ProxyThreads:
    """The proxy itself: one reader and one writer thread per direction of a connection."""

    def __init__(self, upstream: tuple[str, int], rate: float, rtt_s: float) -> None:
        self.upstream, self.delay = upstream, rtt_s / 2
        self.links = (Link(rate), Link(rate))  # to the server, to the client
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []

    def start(self) -> ProxyThreads:
        self._spawn(self._accept)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        for s in list(self._sockets):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in self._threads:
            t.join(2)

    def _spawn(self, target, *args) -> None:  # noqa: ANN001
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sockets.append(s)
            self._pipe(client, server, self.links[0])
            self._pipe(server, client, self.links[1])

    def _pipe(self, src: socket.socket, dst: socket.socket, link: Link) -> None:
        """A reader that timestamps each chunk and a writer that lets it out when the delay
        and the link's rate allow: the delay does not cut the throughput (a long pipe)."""
        line: queue.Queue[tuple[float, bytes]] = queue.Queue()
        self._spawn(self._read, src, line)
        self._spawn(self._write, dst, line, link)

    def _read(self, src: socket.socket, line: queue.Queue) -> None:
        while True:
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = b""
            line.put((time.monotonic() + self.delay, data))
            if not data:
                return

    def _write(self, dst: socket.socket, line: queue.Queue, link: Link) -> None:
        while True:
            ready, data = line.get()
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            wait = link.send_at(len(data), ready) - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                return


def main(argv: list[str]) -> None:
    """`shaping_proxy.py HOST PORT RATE RTT_S`: prints the port it listens on, then serves
    until killed."""
    host, port, rate, rtt = argv
    proxy = ProxyThreads((host, int(port)), float(rate), float(rtt)).start()
    print(proxy.port, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
