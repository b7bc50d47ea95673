"""SHA-256 of a stream, computed beside the socket: a large body's chunks are hashed on a
worker thread while the caller sends (or receives) the next one. hashlib releases the GIL
for any update over 2047 bytes, so the two really run at once on two cores.

Small bodies are hashed on the caller's thread: starting a thread would cost more than it
saves, and a build moves many small blobs.
"""

from __future__ import annotations

import hashlib
import queue
import threading

BACKGROUND_FROM = 16 << 20  # bodies this large or larger are hashed on a worker thread
DEPTH = 4  # chunks queued for the worker: bounds the memory a slow hasher holds


class StreamHash:
    """`update` then `hexdigest`, like hashlib's; `close` ends the worker early (an aborted
    transfer). A chunk may be a view of a buffer the caller reuses: the worker gets a copy
    (a memcpy is several times faster than hashing the bytes)."""

    def __init__(self, size: int) -> None:
        self._hasher = hashlib.sha256()
        self._queue: queue.Queue[bytes | None] | None = None
        self._worker: threading.Thread | None = None
        if size >= BACKGROUND_FROM:
            self._queue = queue.Queue(DEPTH)
            self._worker = threading.Thread(target=self._serve, name="hefbuild-hash",
                                            daemon=True)
            self._worker.start()

    def update(self, chunk: bytes | memoryview) -> None:
        if self._queue is None:
            self._hasher.update(chunk)
        elif chunk:
            self._queue.put(bytes(chunk))  # no copy of a bytes object, a copy of a view

    def hexdigest(self) -> str:
        """The digest of every chunk so far (waits for the worker to catch up, then ends it)."""
        self.close()
        return self._hasher.hexdigest()

    def close(self) -> None:
        if self._worker is not None:
            assert self._queue is not None
            self._queue.put(None)
            self._worker.join()
            self._worker = self._queue = None

    def _serve(self) -> None:
        assert self._queue is not None
        while (chunk := self._queue.get()) is not None:
            self._hasher.update(chunk)
