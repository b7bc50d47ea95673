"""SHA-256 beside the socket for large blobs: the connection's thread moves each chunk between
the socket and the file, and a worker thread hashes it meanwhile, so a verified transfer
takes as long as the slower of the two instead of their sum.

Why: SHA-256 runs at about 0.5 ms a MiB here, about what the receive and write of that MiB
cost on loopback; one after the other on one thread, a 1 GiB download took 1.5x curl's
time.
hashlib, file reads and writes and socket calls all release the GIL, so the two threads run
on two cores.

What is trusted does not change: a download is still adopted only once its digest matched,
and an upload still holds back its last chunk until every byte hashed to its name.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from types import TracebackType
from typing import IO

CHUNK = 1 << 20
FROM = 4 << 20  # a smaller blob moves in a few chunks: a second thread would not pay
DEPTH = 4  # chunks in flight between the two threads (reused: fresh pages cost faults)


def _ring() -> queue.SimpleQueue[bytearray]:
    ring: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    for _ in range(DEPTH):
        ring.put(bytearray(CHUNK))
    return ring


class HashingWriter:
    """A download's sink: each chunk is written to `out` on the caller's thread, as it
    comes, and hashed on a worker thread from a copy in a reused buffer, while the socket
    receives the next (writing and hashing each take about half of a MiB's time; one after
    the other on one thread they were the slowest step). Use it in a `with`: leaving stops
    the worker. Not `overlapped` (a blob known to be small), it hashes on the caller's
    thread too."""

    def __init__(self, out: IO[bytes], overlapped: bool = True) -> None:
        self._out, self._hasher, self._overlapped = out, hashlib.sha256(), overlapped
        self._free = _ring() if overlapped else queue.SimpleQueue[bytearray]()
        self._work = queue.SimpleQueue[tuple[bytearray, int] | None]()
        self._thread = threading.Thread(target=self._run, name="hefbuild-hash-in", daemon=True)
        if overlapped:
            self._thread.start()

    def __call__(self, chunk: bytes | memoryview) -> None:
        if not self._overlapped:
            self._hasher.update(chunk)
        else:
            buf, n = self._free.get(), len(chunk)  # waits while the hash is DEPTH behind
            if n > len(buf):  # a transport's chunk may be larger than ours
                buf = bytearray(n)
            buf[:n] = chunk
            self._work.put((buf, n))
        self._out.write(chunk)

    def digest(self) -> str:
        """Waits for every chunk, then gives the hex digest of all of them."""
        self._stop()
        return self._hasher.hexdigest()

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            buf, n = item
            self._hasher.update(memoryview(buf)[:n])
            self._free.put(buf)

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._work.put(None)
            self._thread.join()

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()


class HashingReader:
    """An upload's body: `read()` reads the next chunk of `f` into a reused buffer on the
    connection's thread and hands it to a worker thread to hash while the connection sends
    it (the two only read it). The chunks come in order, each valid until the next call;
    the last one only once the worker hashed all `size` bytes to `digest`, else
    `mismatch(digest, actual)` is raised instead, so the server never gets a whole body.
    Use it in a `with`: leaving stops the worker."""

    def __init__(self, f: IO[bytes], digest: str, size: int,
                 mismatch: type[Exception]) -> None:
        self._f, self._digest, self._left, self._mismatch = f, digest, size, mismatch
        self._hasher, self._free = hashlib.sha256(), _ring()
        self._work = queue.SimpleQueue[tuple[bytearray, int] | None]()
        self._ended = False
        self._thread = threading.Thread(target=self._run, name="hefbuild-hash-out",
                                        daemon=True)
        self._thread.start()

    def read(self, _n: int = -1) -> memoryview | bytes:
        if self._ended:
            return b""
        buf = self._free.get()  # waits while the hash is DEPTH chunks behind
        wanted = min(CHUNK, self._left)
        n = self._f.readinto(memoryview(buf)[:wanted]) if wanted else 0
        self._left -= n
        if n:
            self._work.put((buf, n))
        if self._left > 0 and n == wanted:  # not the last chunk, nor a file cut short
            return memoryview(buf)[:n]
        self._ended = True
        self._check()  # before the last chunk leaves
        return memoryview(buf)[:n] if n else b""

    def _check(self) -> None:
        self._stop()
        actual = self._hasher.hexdigest()
        if self._left != 0 or self._f.read(1) or actual != self._digest:
            raise self._mismatch(self._digest, actual)

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            buf, n = item
            self._hasher.update(memoryview(buf)[:n])
            self._free.put(buf)

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._work.put(None)
            self._thread.join()

    def __enter__(self) -> HashingReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()
