"""zstd on a gRPC cache's wire: REAPI's compressed blobs (Bazel's `--remote_cache_compression`).

Used only with `[cache] compression = "zstd"` and a server whose `GetCapabilities` lists
ZSTD (grpc_transport.py asks once); this module, and `zstandard` with it, is imported only
then. A blob's digest always names its uncompressed bytes, so the checks do not change:

- a download is decompressed as it arrives and only decompressed bytes reach the sink (where
  cas.py hashes them), `CHUNK` at most at a time, never more than the size the blob is
  declared with: a small stream that inflates without end (a decompression bomb) is cut
  off there, its output never held;
- an upload is compressed chunk by chunk after each chunk was read and hashed, and the
  frame's end goes with the last chunk, which is held back until the whole file hashed to
  its name (grpc_stream.Upload), as for a plain upload.
"""

from __future__ import annotations

from dataclasses import dataclass

import zstandard
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)

from .problems import Oversized, Sink, Undecodable, sunk

ZSTD = re_pb2.Compressor.ZSTD
# Level 1: on float32 weights (SmolLM2-135M's safetensors) it keeps 62 % of the bytes at
# 125-200 MB/s a core; level 3 keeps 54 % at a fifth of that, slower than a gigabit link.
LEVEL = 1
# One thread: zstd's workers (-1: one a core) doubled compression alone (249 vs 125 MB/s,
# 2 loaded cores) but gained nothing end to end (a 538 MB upload at 100 MB/s: 3.68 s vs
# 3.61 s), and they hand out a job's bytes in bursts of several MiB.
THREADS = 0


@dataclass(frozen=True)
class Support:
    """Where the server takes zstd (its CacheCapabilities)."""

    stream: bool  # ByteStream compressed-blobs, and BatchReadBlobs answers
    batch_update: bool  # BatchUpdateBlobs requests

    @classmethod
    def of(cls, caps: re_pb2.CacheCapabilities) -> Support:
        return cls(ZSTD in caps.supported_compressors,
                   ZSTD in caps.supported_batch_update_compressors)


class Decompressing:
    """zstd bytes in (`feed`); the decompressed bytes into `sink` as they come out, at most
    `limit` of them (Oversized past it). `total`: the decompressed bytes so far."""

    def __init__(self, sink: Sink, limit: int, chunk: int) -> None:
        self._sink, self._limit = sink, limit
        self.total = 0
        self._wire, self._wire_limit = 0, _bound(limit)
        # zstandard calls `write` below with each `chunk` of output as it is produced
        self._zstd = zstandard.ZstdDecompressor().stream_writer(self, write_size=chunk)

    def feed(self, data: bytes) -> None:
        self._wire += len(data)
        if self._wire > self._wire_limit:  # e.g. skippable frames without end
            raise Oversized(self._limit, f"a zstd stream longer than any of "
                            f"{self._limit} bytes")
        try:
            self._zstd.write(data)
        except zstandard.ZstdError as exc:
            raise Undecodable(f"came as zstd that does not decompress ({exc})") from None

    def write(self, data: bytes) -> int:
        self.total += len(data)
        if self.total > self._limit:
            raise Oversized(self._limit, f"a blob that decompresses to more than the "
                            f"{self._limit} bytes expected")
        sunk(self._sink, data)
        return len(data)


class Compressing:
    """A blob's chunks in order, each as the zstd bytes to send for it (maybe none yet:
    the compressor may hold them); the frame ends with the last one."""

    def __init__(self, size: int) -> None:
        self._zstd = zstandard.ZstdCompressor(level=LEVEL, threads=THREADS).compressobj(
            size=size)

    def __call__(self, chunk: bytes, last: bool) -> bytes:
        out = self._zstd.compress(chunk)
        return out + self._zstd.flush() if last else out


def compress(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=LEVEL).compress(data)


def _bound(size: int) -> int:
    """More than zstd's longest encoding of `size` bytes, at any level, in frames of
    a few KiB or more (its own bound: size + size/256 + a few bytes a frame)."""
    return size + (size >> 7) + (1 << 12)
