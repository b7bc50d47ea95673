"""Blobs by SHA-256 in the remote cache's CAS: how stage inputs and outputs travel between
a driver and the nodes of a cluster (never through the scheduler's own object store).

Every download is hashed as it streams into the local store and trusted only when the
digest matches; an upload sends only what the cache does not have.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..settings import CacheSettings
from ..store import Store
from .transport import RemoteError, Transport, transport_for

ATTEMPTS = 3
T = TypeVar("T")


class WrongBytes(Exception):
    """The cache's bytes for a digest hash to something else."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"blob {expected[:12]}… hashes to {actual[:12]}…")
        self.expected, self.actual = expected, actual


class MissingBlob(LookupError):
    """The cache does not have a blob that should be there."""


class BlobStore:
    def __init__(self, settings: CacheSettings, transport: Transport | None = None) -> None:
        self.shown = settings.shown
        self._t = transport or transport_for(settings)
        self.sent = 0
        self.received = 0

    def has(self, digest: str) -> bool:
        return retry(self._t.head, f"cas/{digest}")

    def ensure(self, path: Path, digest: str) -> None:
        """`path` (whose SHA-256 is `digest`) is in the CAS after this."""
        if not self.has(digest):
            self.sent += retry(self._t.put, f"cas/{digest}", path)

    def download(self, digest: str, store: Store) -> int | None:
        """The blob, verified, into the local store; its size, or None if the cache lacks it.
        Raises WrongBytes for bytes that do not hash to `digest` (nothing is kept)."""
        with store.incoming() as (path, out):
            hasher = hashlib.sha256()

            def sink(chunk: bytes | memoryview) -> None:
                hasher.update(chunk)
                out.write(chunk)

            size = self._t.get(f"cas/{digest}", sink)
            out.close()
            if size is None:
                return None
            if hasher.hexdigest() != digest:
                raise WrongBytes(digest, hasher.hexdigest())
            store.put_verified(path, digest)
        self.received += size
        return size

    def fetch(self, digest: str, store: Store, dest: Path) -> None:
        """The blob as the file `dest` (a link to the store's object), fetched if needed."""
        if not store.verify(digest) and retry(self.download, digest, store) is None:
            raise MissingBlob(f"remote cache {self.shown} has no blob {digest[:12]}… "
                              f"(evicted?)")
        store.materialize(digest, dest)


def retry(call: Callable[..., T], *args: object) -> T:
    """A dropped connection or a 502/503/504 is worth two more tries, with backoff."""
    for attempt in range(ATTEMPTS):
        try:
            return call(*args)
        except RemoteError as exc:
            if not exc.transient or attempt == ATTEMPTS - 1:
                raise
            time.sleep(0.2 * 2 ** attempt * (1 + random.random()))
    raise AssertionError("unreachable")
