"""ByteStream's two directions in chunks, for grpc_transport.py: a read cut off past the
blob's size, and a write hashed on the way whose last chunk waits for the whole file to hash
to its name (`encode`: each chunk compressed for compressed-blobs, grpc_zstd.py).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

import grpc
from buildgrid._protos.google.bytestream import bytestream_pb2

from .problems import CorruptSource, Oversized, Sink, sunk

if TYPE_CHECKING:
    from .grpc_zstd import Compressing


class Upload:
    """A file as ByteStream WriteRequests, hashed on the way. The last chunk is sent only once
    every byte hashed to the blob's name; otherwise the call is cancelled before it, so the
    server never gets a complete (committable) upload. Reading waits until the call exists,
    so that it can be cancelled from the request thread."""

    def __init__(self, f: IO[bytes], resource: str, digest: str, size: int, chunk: int,
                 encode: Compressing | None = None) -> None:
        self._f, self._resource, self._digest, self._left = f, resource, digest, size
        self._chunk, self._encode = chunk, encode
        self._hasher = hashlib.sha256()
        self.sent = 0  # bytes on the wire (compressed ones, with `encode`)
        self._call: grpc.Future | None = None
        self._ready = threading.Event()
        self.corrupt: CorruptSource | None = None

    def started(self, call: grpc.Future) -> None:
        self._call = call
        self._ready.set()

    def requests(self) -> Iterator[bytestream_pb2.WriteRequest]:
        self._ready.wait()
        ahead = self._next()
        while ahead:
            chunk, ahead = ahead, self._next()
            if not ahead and not self._intact():
                assert self._call is not None
                self._call.cancel()
                return
            data = chunk if self._encode is None else self._encode(chunk, not ahead)
            # The compressor may keep a chunk for now, or give out several at once (its
            # workers' jobs): messages stay at `chunk` bytes, under gRPC's 4 MiB limit.
            for start in range(0, len(data), self._chunk):
                piece = data[start:start + self._chunk]
                yield self._request(piece, not ahead and start + len(piece) == len(data))

    def _request(self, data: bytes, last: bool) -> bytestream_pb2.WriteRequest:
        # For compressed-blobs the offsets count compressed bytes (after a first 0).
        request = bytestream_pb2.WriteRequest(resource_name=self._resource if self.sent == 0
                                              else "", write_offset=self.sent, data=data,
                                              finish_write=last)
        self.sent += len(data)
        return request

    def _next(self) -> bytes:
        chunk = self._f.read(min(self._chunk, self._left)) if self._left > 0 else b""
        self._left -= len(chunk)
        self._hasher.update(chunk)
        return chunk

    def _intact(self) -> bool:
        actual = self._hasher.hexdigest()
        if self._left == 0 and not self._f.read(1) and actual == self._digest:
            return True
        self.corrupt = CorruptSource(self._digest, actual)
        return False


class Counted:
    """A plain stream into the sink, cut off past `limit` bytes."""

    def __init__(self, sink: Sink, limit: int) -> None:
        self._sink, self._limit, self.total = sink, limit, 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if self.total > self._limit:
            raise Oversized(self._limit, f"a stream longer than the {self._limit} bytes "
                            f"expected")
        sunk(self._sink, data)
