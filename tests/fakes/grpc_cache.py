"""A small REAPI v2 cache server in this process (grpcio, BuildGrid's servicer classes) that
stores honestly and can be told to lie, to demand a bearer token, or to speak TLS.

`GrpcCache` serves ActionCache, ContentAddressableStorage (FindMissingBlobs, Batch*Blobs)
and ByteStream for every instance name, from dicts in memory. Unlike BuildGrid it checks
nothing: an ActionResult may name blobs it does not have. Tell it to misbehave:

    lie(sha, data)     reads of the blob `sha` answer `data` (wrong bytes, or another size);
                       FindMissingBlobs still says it is there
    forget(sha)        the blob is gone, the entries naming it stay
    lie_zstd(sha, raw) compressed reads of `sha` answer `raw` as the zstd bytes, as they are
                       (garbage, a bomb); plain reads are not affected

With `zstd=True` it answers GetCapabilities listing ZSTD (for ByteStream and both batch
RPCs) and moves blobs zstd-compressed where a client asks (ByteStream's compressed-blobs
resources, BatchReadBlobs' acceptable_compressors, BatchUpdateBlobs' compressor); it stores
them uncompressed, checked against their digest, and refuses compressed-blobs without it.
Off (the default), it has no Capabilities service at all.

`calls` logs every RPC's name, `updates` every UpdateActionResult request, `auth_seen`
every authorization value received, `moved` every blob read or written (`Moved`: the bytes
on the wire, compressed or not); `delay_s` holds every answer. With `token`, a call
without `authorization: Bearer <token>` is refused with UNAUTHENTICATED. With
`tls=(key_pem, cert_pem)` it listens with TLS.
Only 127.0.0.1; `stop()` ends the server and its threads.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import NamedTuple

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as re_grpc,
)
from buildgrid._protos.google.bytestream import bytestream_pb2, bytestream_pb2_grpc
from buildgrid._protos.google.rpc import status_pb2

READ_CHUNK = 1 << 16
ZSTD = re_pb2.Compressor.ZSTD
ZSTD_LEVEL = 3  # a server may compress at any level: not the client's 1


class Moved(NamedTuple):
    rpc: str  # "read" or "write"
    sha: str
    wire: int  # bytes of blob data in the messages
    compressed: bool


class GrpcCache:
    def __init__(self, token: str | None = None, tls: tuple[bytes, bytes] | None = None,
                 instance: str = "main", zstd: bool = False) -> None:
        self.token, self.tls, self.instance, self.zstd = token, tls, instance, zstd
        self.blobs: dict[str, bytes] = {}
        self.entries: dict[tuple[str, int], bytes] = {}
        self.lies: dict[str, bytes] = {}
        self.zstd_lies: dict[str, bytes] = {}
        self.moved: list[Moved] = []
        self._packed: dict[str, tuple[bytes, bytes]] = {}  # sha: (the bytes, as zstd)
        self.calls: list[str] = []
        self.updates: list[re_pb2.UpdateActionResultRequest] = []
        self.auth_seen: list[str] = []
        self.delay_s = 0.0  # every call waits this long before it is answered
        self.port = 0
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    @property
    def url(self) -> str:
        scheme = "grpcs" if self.tls else "grpc"
        return f"{scheme}://127.0.0.1:{self.port}/{self.instance}"

    def lie(self, sha: str, data: bytes) -> None:
        self.lies[sha] = data

    def forget(self, sha: str) -> None:
        del self.blobs[sha]

    def lie_zstd(self, sha: str, raw: bytes) -> None:
        self.zstd_lies[sha] = raw

    def served(self, sha: str) -> bytes | None:
        return self.lies.get(sha, self.blobs.get(sha))

    def served_zstd(self, sha: str) -> bytes | None:
        """The blob as zstd: compressed once, as by a server that stores it so."""
        if sha in self.zstd_lies:
            return self.zstd_lies[sha]
        data = self.served(sha)
        if data is None:
            return None
        packed = self._packed.get(sha)
        if packed is None or packed[0] is not data:
            packed = (data, _zstd().ZstdCompressor(level=ZSTD_LEVEL).compress(data))
            self._packed[sha] = packed
        return packed[1]

    def note(self, rpc: str, sha: str, wire: int, compressed: bool) -> None:
        with self._lock:
            self.moved.append(Moved(rpc, sha, wire, compressed))

    def check(self, rpc: str, context: grpc.ServicerContext) -> None:
        """Log the call; refuse it without the right bearer token."""
        got = dict(context.invocation_metadata()).get("authorization", "")
        with self._lock:
            self.calls.append(rpc)
            self.auth_seen.append(got)
        if self.token is not None and got != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no valid bearer token")
        if self.delay_s:
            time.sleep(self.delay_s)

    def start(self) -> GrpcCache:
        server = grpc.server(ThreadPoolExecutor(8, thread_name_prefix="grpc-cache"))
        re_grpc.add_ActionCacheServicer_to_server(_ActionCache(self), server)
        re_grpc.add_ContentAddressableStorageServicer_to_server(_Cas(self), server)
        bytestream_pb2_grpc.add_ByteStreamServicer_to_server(_ByteStream(self), server)
        if self.zstd:
            re_grpc.add_CapabilitiesServicer_to_server(_Capabilities(self), server)
        if self.tls:
            creds = grpc.ssl_server_credentials([self.tls])
            self.port = server.add_secure_port("127.0.0.1:0", creds)
        else:
            self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None

    def __enter__(self) -> GrpcCache:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class _ActionCache(re_grpc.ActionCacheServicer):
    def __init__(self, cache: GrpcCache) -> None:
        self.cache = cache

    def GetActionResult(self, request, context):  # noqa: ANN001, ANN201, N802
        self.cache.check("GetActionResult", context)
        key = (request.action_digest.hash, request.action_digest.size_bytes)
        raw = self.cache.entries.get(key)
        if raw is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such action")
        return re_pb2.ActionResult.FromString(raw)

    def UpdateActionResult(self, request, context):  # noqa: ANN001, ANN201, N802
        self.cache.check("UpdateActionResult", context)
        self.cache.updates.append(request)
        key = (request.action_digest.hash, request.action_digest.size_bytes)
        self.cache.entries[key] = request.action_result.SerializeToString()
        return request.action_result


class _Cas(re_grpc.ContentAddressableStorageServicer):
    def __init__(self, cache: GrpcCache) -> None:
        self.cache = cache

    def FindMissingBlobs(self, request, context):  # noqa: ANN001, ANN201, N802
        self.cache.check("FindMissingBlobs", context)
        blobs = self.cache.blobs
        return re_pb2.FindMissingBlobsResponse(missing_blob_digests=[
            d for d in request.blob_digests
            if d.hash not in blobs or len(blobs[d.hash]) != d.size_bytes])

    def BatchReadBlobs(self, request, context):  # noqa: ANN001, ANN201, N802
        self.cache.check("BatchReadBlobs", context)
        packed = self.cache.zstd and ZSTD in request.acceptable_compressors
        answers = []
        for d in request.digests:
            data = (self.cache.served_zstd if packed else self.cache.served)(d.hash)
            code = grpc.StatusCode.OK if data is not None else grpc.StatusCode.NOT_FOUND
            if data is not None:
                self.cache.note("read", d.hash, len(data), packed)
            answers.append(re_pb2.BatchReadBlobsResponse.Response(
                digest=d, data=data or b"", compressor=ZSTD if packed else 0,
                status=status_pb2.Status(code=code.value[0])))
        return re_pb2.BatchReadBlobsResponse(responses=answers)

    def BatchUpdateBlobs(self, request, context):  # noqa: ANN001, ANN201, N802
        self.cache.check("BatchUpdateBlobs", context)
        answers = []
        for r in request.requests:
            packed = r.compressor == ZSTD
            if r.compressor not in ((0, ZSTD) if self.cache.zstd else (0,)):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "compressor not supported")
            data = _unzstd(r.data) if packed else r.data
            self.cache.note("write", r.digest.hash, len(r.data), packed)
            ok = data is not None and hashlib.sha256(data).hexdigest() == r.digest.hash
            if ok:
                self.cache.blobs[r.digest.hash] = data
            code = grpc.StatusCode.OK if ok else grpc.StatusCode.INVALID_ARGUMENT
            answers.append(re_pb2.BatchUpdateBlobsResponse.Response(
                digest=r.digest, status=status_pb2.Status(code=code.value[0])))
        return re_pb2.BatchUpdateBlobsResponse(responses=answers)


class _ByteStream(bytestream_pb2_grpc.ByteStreamServicer):
    def __init__(self, cache: GrpcCache) -> None:
        self.cache = cache

    def Read(self, request, context) -> Iterator[bytestream_pb2.ReadResponse]:  # noqa: ANN001, N802
        self.cache.check("ByteStream.Read", context)
        sha, packed = self._blob(request.resource_name, context)
        data = (self.cache.served_zstd if packed else self.cache.served)(sha)
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such blob")
        self.cache.note("read", sha, len(data), packed)
        for start in range(0, len(data), READ_CHUNK):
            yield bytestream_pb2.ReadResponse(data=data[start:start + READ_CHUNK])

    def Write(self, request_iterator, context):  # noqa: ANN001, ANN201, N802
        """Checked as it arrives (decompressed and hashed chunk by chunk, as a server
        streams an upload), stored once complete and matching."""
        self.cache.check("ByteStream.Write", context)
        parts, hasher, wire, finished = [], hashlib.sha256(), 0, False
        sha, unpack = "", None
        for request in request_iterator:
            if not sha:
                sha, packed = self._blob(request.resource_name, context)
                unpack = _zstd().ZstdDecompressor().decompressobj() if packed else None
            if request.write_offset != wire:  # compressed: counts the compressed bytes
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "write_offset out of order")
            wire += len(request.data)
            try:
                piece = request.data if unpack is None else unpack.decompress(request.data)
            except _zstd().ZstdError:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not zstd")
            hasher.update(piece)
            parts.append(piece)
            finished = request.finish_write
        if not finished or hasher.hexdigest() != sha:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "incomplete or wrong bytes")
        self.cache.note("write", sha, wire, unpack is not None)
        self.cache.blobs[sha] = b"".join(parts)
        return bytestream_pb2.WriteResponse(committed_size=wire)

    def _blob(self, resource: str, context: grpc.ServicerContext) -> tuple[str, bool]:
        """The digest's hash a resource name names, and whether it is compressed-blobs."""
        parts = resource.split("/")
        if "compressed-blobs" not in parts:
            return parts[parts.index("blobs") + 1], False
        at = parts.index("compressed-blobs")
        if not self.cache.zstd or parts[at + 1] != "zstd":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "compressor not supported")
        return parts[at + 2], True


class _Capabilities(re_grpc.CapabilitiesServicer):
    def __init__(self, cache: GrpcCache) -> None:
        self.cache = cache

    def GetCapabilities(self, request, context):  # noqa: ANN001, ANN201, N802
        self.cache.check("GetCapabilities", context)
        return re_pb2.ServerCapabilities(cache_capabilities=re_pb2.CacheCapabilities(
            digest_functions=[re_pb2.DigestFunction.SHA256],
            supported_compressors=[ZSTD], supported_batch_update_compressors=[ZSTD]))


def _zstd():  # noqa: ANN202
    import zstandard  # only for a server told to speak zstd

    return zstandard


def _unzstd(raw: bytes) -> bytes | None:
    """A client's zstd bytes, decompressed (None: not zstd). Whole: a test double, trusting
    the sizes its tests send."""
    try:
        return _zstd().ZstdDecompressor().decompressobj().decompress(raw)
    except _zstd().ZstdError:
        return None
