"""Blobs by SHA-256 in the remote cache's CAS: how stage outputs reach the shared cache, and
how stage inputs and outputs travel between a driver and the nodes of a cluster (never
through the scheduler's own object store).

Nothing is trusted by name alone:
- a download stops at the size the entry declares and is hashed as it streams into the
  local store; it is kept only when both size and digest match;
- an upload hashes the local bytes as they are sent and aborts before the last byte when
  they do not match their name (nginx/WebDAV would keep whatever it gets, for everyone),
  unless they are a store object the store vouches for (hashed as it was stored, its
  inode unchanged since);
- presence by HEAD is not proof: a blob is sent again when the cache's size differs, and a
  digest the cache served wrong bytes for is never trusted by HEAD again in this process.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from ..declare.settings import CacheSettings
from ..store.store import Store
from . import overlap
from .fanout import each
from .landing import LOCAL_THREADS, SMALL, Landing
from .overlap import HashingWriter
from .problems import Oversized, RemoteError, SinkError, Undecodable
from .transport import Transport, batched, transport_for

ATTEMPTS = 3
T = TypeVar("T")


class BadBlob(Exception):
    """The cache's blob for a digest is not that digest's bytes."""

    def __init__(self, digest: str, message: str) -> None:
        super().__init__(message)
        self.digest = digest


class WrongBytes(BadBlob):
    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(expected, f"blob {expected[:12]}… hashes to {actual[:12]}…")
        self.expected, self.actual = expected, actual


class WrongSize(BadBlob):
    def __init__(self, digest: str, declared: int, found: int | str) -> None:
        super().__init__(digest, f"blob {digest[:12]}… is declared as {declared} bytes, the "
                         f"cache has {found}")
        self.declared, self.found = declared, found


class MissingBlob(LookupError):
    """The cache does not have a blob that should be there."""


class BlobStore:
    def __init__(self, settings: CacheSettings, transport: Transport | None = None) -> None:
        self.shown = settings.shown
        self.transfers = settings.transfers
        self._t = transport or transport_for(settings)
        self.sent = 0
        self.received = 0
        self._count = threading.Lock()  # blobs move on several threads at once (cache.py)
        self.bad: set[str] = set()  # digests the cache served wrong bytes or sizes for

    def size(self, digest: str) -> int | None:
        """The cache's size for the blob (-1: present, size not said), None when absent."""
        return retry(self._t.head, f"cas/{digest}")

    def has(self, digest: str, size: int) -> bool:
        """Present with the right size, and never seen with wrong bytes."""
        return not self.absent([(digest, size)])

    def absent(self, refs: list[tuple[str, int]]) -> set[str]:
        """The digests of `refs` (sha256, size) not there with that size, or seen with wrong
        bytes: one request for all where the transport can (gRPC), else one HEAD each."""
        many = batched(self._t)
        if many is None:
            return {d for d, size in refs if d in self.bad or self.size(d) != size}
        bad = {d for d, _ in refs if d in self.bad}
        rest = [(d, size) for d, size in refs if d not in bad]
        return bad | (retry(many.missing, rest) if rest else set())

    def ensure(self, path: Path, digest: str, check: bool = True) -> None:
        """`path` (whose SHA-256 must be `digest`) is in the CAS after this. With `check`,
        its bytes are hashed as they go (CorruptSource when they are not `digest`'s);
        without, the caller vouches for them (a store object the store vouches for)."""
        if not self.has(digest, path.stat().st_size):
            sent = retry(self._t.put, f"cas/{digest}", path, digest if check else None)
            with self._count:
                self.sent += sent

    def download(self, digest: str, store: Store, size: int | None = None) -> int | None:
        """The blob, verified, into the local store; its size, or None if the cache lacks it.
        At most `size` bytes are read (unknown: the size HEAD gives). Raises WrongBytes or
        WrongSize for anything else (nothing is kept), the OSError of a local disk."""
        if size is None:
            size = self.size(digest)
            if size is None:
                return None
        try:
            return self._download(digest, store, None if size < 0 else size)
        except SinkError as exc:
            raise exc.cause from None  # the local disk, not the cache

    def _download(self, digest: str, store: Store, size: int | None) -> int | None:
        with store.incoming(digest) as new:
            with HashingWriter(new.out, size is None or size >= overlap.FROM) as sink:
                with self._refusing(digest):
                    got = self._t.get(f"cas/{digest}", sink, size)
                actual = sink.digest()
            if got is None:
                return None
            self._check(digest, size, got, actual)
            store.adopt(new, digest)
        with self._count:
            self.received += got
        return got

    @contextmanager
    def _refusing(self, digest: str) -> Iterator[None]:
        """A transfer that the cache's answer for `digest` broke off: the blob is bad."""
        try:
            yield
        except Oversized as exc:
            self.bad.add(digest)
            raise WrongSize(digest, exc.limit, "more") from exc
        except Undecodable as exc:
            self.bad.add(digest)
            raise BadBlob(digest, f"blob {digest[:12]}… {exc.detail}") from exc

    def download_all(self, refs: list[tuple[str, int]], store: Store) -> list[int | None]:
        """Each blob (sha256, size), verified, into the local store, `transfers` on the wire
        at once; their sizes in order (None: the cache lacks it). A small blob is received
        whole, then hashed and written (landing.py). A blob of wrong bytes or size does not
        stop the others: they land, then its WrongBytes or WrongSize is raised; a failing
        cache (RemoteError) ends the batch once the blobs in flight have landed."""
        # Several connections keep the cores busy landing their own blobs; one at a time
        # leaves a core idle, which the pool fills.
        threads = LOCAL_THREADS if self.transfers == 1 else 0
        # A connection holds at most two buffers: the blob it owes and the one it receives.
        with store.batch(), Landing(self._landed(store), 2 * self.transfers + 2 * threads,
                                    threads) as landing:
            return each(self._receive, [(d, size, store, landing) for d, size in refs],
                        self.transfers)

    def _receive(self, digest: str, size: int, store: Store, landing: Landing) -> int | None:
        try:
            return self._received(digest, size, store, landing)
        except BadBlob as exc:  # that blob's fault, not the cache's: the others go on
            landing.refuse(exc)
            return None

    def _received(self, digest: str, size: int, store: Store, landing: Landing) -> int | None:
        if not 0 <= size <= SMALL:
            landing.settle()
            return self.download(digest, store, size)
        data = landing.buffer(size)
        try:
            with self._refusing(digest):
                got = self._get_into(digest, data, landing.settle)
            if got is not None:
                self._check_size(digest, size, got)
        except BaseException:
            landing.drop(data)
            raise
        if got is None:
            landing.drop(data)
        elif landing.threaded:
            landing.hand_over(digest, data[:got])
        else:  # landed here once the next request is sent (landing.py)
            landing.owe(digest, data[:got])
        return got

    def _get_into(self, digest: str, data: memoryview,
                  meanwhile: Callable[[], None]) -> int | None:
        """The blob's bytes into `data` (its size + 1 bytes: one more shows as Oversized);
        `meanwhile` runs once, after the request is sent where the transport can say when."""
        into = getattr(self._t, "get_into", None)
        if into is not None:  # HTTP: straight from the socket, no copy
            return into(f"cas/{digest}", data, meanwhile)
        meanwhile()
        limit, filled = len(data) - 1, 0

        def sink(chunk: bytes | memoryview) -> None:
            nonlocal filled
            end = filled + len(chunk)
            if end > limit:  # the transports stop at the limit; never write past it
                raise Oversized(limit, f"answer larger than the {limit} bytes expected")
            data[filled:end] = chunk
            filled = end

        return self._t.get(f"cas/{digest}", sink, limit)

    def _landed(self, store: Store) -> Callable[[str, memoryview], None]:
        def land(digest: str, data: memoryview) -> None:
            """On a landing thread: hashed first, written only when it is `digest`."""
            self._check_bytes(digest, hashlib.sha256(data).hexdigest())
            store.put_verified_bytes(data, digest)
            with self._count:
                self.received += len(data)
        return land

    def _check_size(self, digest: str, size: int, got: int) -> None:
        if got != size:
            self.bad.add(digest)
            raise WrongSize(digest, size, got)

    def _check(self, digest: str, size: int | None, got: int, actual: str) -> None:
        if size is not None:
            self._check_size(digest, size, got)
        self._check_bytes(digest, actual)

    def _check_bytes(self, digest: str, actual: str) -> None:
        if actual != digest:
            self.bad.add(digest)
            raise WrongBytes(digest, actual)

    def fetch(self, digest: str, store: Store, dest: Path, size: int | None = None) -> None:
        """The blob as the file `dest` (a link to the store's object), fetched if needed."""
        if not store.verify(digest) and retry(self.download, digest, store, size) is None:
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
