"""Small blobs land beside the socket: a blob of up to `SMALL` bytes is received whole into
memory, then hashed, checked and written into the local store. One blob at a time, that runs
on a pool of `LOCAL_THREADS` threads while the connection already receives the next blob;
with several connections, each lands its own (they keep the cores busy already, and a pool
behind them measured slower), and does it once it has sent its next request, so the landing
runs while that request travels instead of between the last byte of a blob and the next
request (200 x 1 MiB, 4 at once, in rounds against the old order: 0.985 -> 0.998 of curl's
speed on a link of 100 MB/s and 20 ms, 1.18 -> 1.20 and 1.21 on loopback; those loopback
rounds deleted files between rounds, which slowed curl's, so only the step counts there:
docs/transfers.md).

Why: per small blob, SHA-256 (0.5 ms a MiB) and the store's inode work (a temp file, and for
the first object of a shard its folder) came one after the other with the receive on a single
thread; a blob at a time moved at 0.6x curl's speed. Creating an inode is no small cost: on
an ext4 without a journal, the kernel skips every inode of the group freed in the last minute,
0.2-1 ms of kernel time a file where other processes churn files. hashlib and those system
calls release the GIL, so on a second core they run beside the receive.

What is trusted does not change, and for these blobs it tightens: their bytes are hashed
before any is written, so bytes that are not their name never reach the disk; a good blob is
still written to a temp file and renamed into place (atomic; a kill -9 leaves only a temp
file the store sweeps). Larger blobs stream to disk as they arrive, hashed on the way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

SMALL = 4 << 20  # a blob up to this size is received whole, then landed on the pool
LOCAL_THREADS = 2  # hashing and writing beside a lone connection (2 beat 1 and 3 here)

Land = Callable[[str, memoryview], None]


class Landing:
    """The local side of a batch of downloads. `land(digest, data)` (hash, check, store) runs
    on a pool of `threads` (none: on the caller's thread). At most `held` blobs are in memory
    at once, received or being received and not yet landed (a connection waits for room
    before it asks for the next one). Leaving the `with` waits for every landing; the first
    failure (of a landing, or a blob `refuse`d) is raised then, unless an error is already on
    its way out: a wrong blob in a batch does not stop the good ones."""

    def __init__(self, land: Land, held: int, threads: int = LOCAL_THREADS) -> None:
        self._land = land
        self._room = threading.BoundedSemaphore(held)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="hefbuild-land") \
            if threads else None
        self._landings: list[Future[None]] = []
        self._owed: dict[int, tuple[str, memoryview]] = {}  # by thread: see `owe`
        self._lock = threading.Lock()
        # Buffers are reused: a fresh 1 MiB one is fresh pages, and faulting them in as
        # the socket fills them cost more kernel time than the receive itself.
        self._free: list[bytearray] = []

    @property
    def threaded(self) -> bool:
        """Landings run on the pool (else on the connections' own threads)."""
        return self._pool is not None

    def buffer(self, size: int) -> memoryview:
        """Room for a blob of `size` bytes and one more (so an answer that is too long shows
        as such); `drop` it or `hand_over` it."""
        self._room.acquire()
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf) > size:
                    return memoryview(self._free.pop(i))[:size + 1]
        return memoryview(bytearray(size + 1))

    def drop(self, data: memoryview) -> None:
        """A buffer that will not be landed (the blob was absent, or its transfer failed)."""
        self._give_back(data)

    def _give_back(self, data: memoryview) -> None:
        with self._lock:
            self._free.append(data.obj)  # type: ignore[arg-type]
        self._room.release()

    def hand_over(self, digest: str, data: memoryview) -> None:
        """Land `data` as `digest` on the pool (no pool: here and now); the buffer's room is
        free once it is done."""
        if self._pool is None:
            landing: Future[None] = Future()
            try:
                self._landed(digest, data)
                landing.set_result(None)
            except Exception as exc:  # raised at the end, like the pool's: the others go on
                landing.set_exception(exc)
        else:
            landing = self._pool.submit(self._landed, digest, data)
        with self._lock:
            self._landings.append(landing)

    def owe(self, digest: str, data: memoryview) -> None:
        """Land `data` later on this thread, at its next `settle`: a connection that lands
        its own blobs does it once it has asked for the next one, while that request
        travels. Whatever is still owed lands when the `with` ends."""
        self.settle()  # one owed blob a thread: an earlier one lands now
        with self._lock:
            self._owed[threading.get_ident()] = (digest, data)

    def settle(self) -> None:
        """Land what this thread owes, if anything (`owe`)."""
        with self._lock:
            owed = self._owed.pop(threading.get_ident(), None)
        if owed is not None:
            self.hand_over(*owed)

    def refuse(self, exc: Exception) -> None:
        """A blob refused before it could land: its error is raised at the end, like a
        landing's."""
        refused: Future[None] = Future()
        refused.set_exception(exc)
        with self._lock:
            self._landings.append(refused)

    def _landed(self, digest: str, data: memoryview) -> None:
        try:
            self._land(digest, data)
        finally:
            self._give_back(data)

    def __enter__(self) -> Landing:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            owed, self._owed = list(self._owed.values()), {}
        for digest, data in owed:  # received and checked for size: land them, error or not
            self.hand_over(digest, data)
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # nothing still writes into the store after this
        if exc is None:
            for landing in self._landings:
                landing.result()  # the first failure, in the order the blobs arrived
