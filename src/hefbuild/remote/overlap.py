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
from typing import IO, Self

CHUNK = 1 << 20
FROM = 4 << 20  # a smaller blob moves in a few chunks: a second thread would not pay
DEPTH = 4  # chunks in flight between the two threads (reused: fresh pages cost faults)


class _HashWorker:
    """A SHA-256 fed on a worker thread through a ring of DEPTH reused buffers: `take` a
    free buffer (waits while the hash is DEPTH chunks behind), fill it, `give` it; the
    worker hashes it and puts it back. Without `threaded`, `give` hashes on the caller's
    thread (a blob known to be small: a second thread would not pay). Use it in a `with`:
    leaving stops the worker."""

    def __init__(self, name: str, threaded: bool = True) -> None:
        self._hasher, self._free = hashlib.sha256(), queue.SimpleQueue[bytearray]()
        self._work = queue.SimpleQueue[tuple[bytearray, int] | None]()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        if threaded:
            for _ in range(DEPTH):
                self._free.put(bytearray(CHUNK))
            self._thread.start()

    def take(self, size: int = CHUNK) -> bytearray:
        buf = self._free.get()
        return buf if len(buf) >= size else bytearray(size)  # a transport's larger chunk

    def give(self, buf: bytearray, n: int) -> None:
        if self._thread.is_alive():
            self._work.put((buf, n))
        else:
            self._hasher.update(memoryview(buf)[:n])

    def hexdigest(self) -> str:
        """Waits for every chunk given, then the digest of all of them."""
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()


class HashingWriter(_HashWorker):
    """A download's sink: each chunk is written to `out` on the caller's thread, as it
    comes, and hashed on a worker thread from a copy in a reused buffer, while the socket
    receives the next (writing and hashing each take about half of a MiB's time; one after
    the other on one thread they were the slowest step). Not `overlapped` (a blob known to
    be small), it hashes on the caller's thread too."""

    def __init__(self, out: IO[bytes], overlapped: bool = True) -> None:
        super().__init__("hefbuild-hash-in", overlapped)
        self._out = out

    def __call__(self, chunk: bytes | memoryview) -> None:
        if self.overlapped:
            buf, n = self.take(len(chunk)), len(chunk)
            buf[:n] = chunk
            self.give(buf, n)
        else:
            self._hasher.update(chunk)
        self._out.write(chunk)

    @property
    def overlapped(self) -> bool:
        """Hashing on the worker: a transport may then receive each chunk straight into a
        buffer of the ring (`take`, then `filled`), which saves copying it to hash it."""
        return self._thread.is_alive()

    def filled(self, buf: bytearray, n: int) -> None:
        """The first `n` bytes of a buffer from `take` are the next chunk: hashed on the
        worker while they are written here. The buffer goes back to the ring only once
        both are done, since this thread takes its next buffer after the write."""
        self.give(buf, n)
        self._out.write(memoryview(buf)[:n])

    def digest(self) -> str:
        """Waits for every chunk, then gives the hex digest of all of them."""
        return self.hexdigest()


class HashingReader(_HashWorker):
    """An upload's body: `read()` reads the next chunk of `f` into a reused buffer on the
    connection's thread and hands it to a worker thread to hash while the connection sends
    it (the two only read it). The chunks come in order, each valid until the next call;
    the last one only once the worker hashed all `size` bytes to `digest`, else
    `mismatch(digest, actual)` is raised instead, so the server never gets a whole body."""

    def __init__(self, f: IO[bytes], digest: str, size: int,
                 mismatch: type[Exception]) -> None:
        super().__init__("hefbuild-hash-out")
        self._f, self._digest, self._left, self._mismatch = f, digest, size, mismatch
        self._ended = False

    def read(self, _n: int = -1) -> memoryview | bytes:
        if self._ended:
            return b""
        buf = self.take()
        wanted = min(CHUNK, self._left)
        n = self._f.readinto(memoryview(buf)[:wanted]) if wanted else 0
        self._left -= n
        if n:
            self.give(buf, n)
        if self._left > 0 and n == wanted:  # not the last chunk, nor a file cut short
            return memoryview(buf)[:n]
        self._ended = True
        self._check()  # before the last chunk leaves
        return memoryview(buf)[:n] if n else b""

    def _check(self) -> None:
        actual = self.hexdigest()
        if self._left != 0 or self._f.read(1) or actual != self._digest:
            raise self._mismatch(self._digest, actual)
