"""The gRPC transport: the cache half of the Remote APIs (REAPI v2), the protocol of Bazel's
`--remote_cache=grpc://…` (BuildGrid, BuildBuddy, Buildbarn, NativeLink, bazel-remote).

The same cache paths as HTTP, on these RPCs:

    ac/<key>   get  ActionCache.GetActionResult, re-serialized deterministically (the bytes
                    hefbuild's own codec writes, reapi.py, so cache.py decodes and checks them
                    as it does an HTTP answer)
               put  ActionCache.UpdateActionResult
    cas/<sha>  missing (many at once)  ContentAddressableStorage.FindMissingBlobs
               get  BatchReadBlobs up to BATCH_LIMIT bytes, else ByteStream.Read, chunk by
                    chunk into the sink (a large blob is never whole in memory)
               put  BatchUpdateBlobs up to BATCH_LIMIT, else ByteStream.Write from the file,
                    hashed as it goes; the last chunk is held back until the bytes hash to
                    their name, so a corrupt local file is never committed

With `[cache] compression = "zstd"`, blobs cross the wire zstd-compressed where the server's
GetCapabilities (asked once, at the first blob) lists ZSTD: ByteStream's compressed-blobs
resources and the batch RPCs' compressor fields (grpc_zstd.py); elsewhere they go plain.

A CAS names a blob by hash *and* size, so `get` needs the size: every caller passes it as the
limit (cas.py, cache.py). Nothing the server sends is trusted here: cas.py and cache.py hash
and size-check every blob as it streams, and check every entry's signature, as over HTTP.
The message classes are BuildGrid's (its wheel ships the generated REAPI modules).
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as re_grpc,
)
from buildgrid._protos.google.bytestream import bytestream_pb2, bytestream_pb2_grpc

from ..declare.settings import SETTINGS_FILE, CacheSettings
from ..errors import SpecError
from .grpc_channel import Absent, GrpcChannel, status_error
from .grpc_stream import Counted, Upload
from .problems import CorruptSource, Oversized, Problem, RemoteError, Sink, sunk

if TYPE_CHECKING:
    from .grpc_zstd import Compressing, Decompressing, Support

# Blobs up to this size go in one Batch*Blobs message; larger ones stream through ByteStream.
# gRPC's default message limit is 4 MiB and BuildGrid caps a batch at 4 MiB - 1 KiB: 1 MiB
# leaves room for the envelope and keeps what one blob holds in memory small.
BATCH_LIMIT = 1 << 20
CHUNK = 1 << 20  # ByteStream.Write's data per message (well under the 4 MiB limit)
FIND_MISSING_MAX = 1000  # digests per FindMissingBlobs request (~75 bytes each)
# hefbuild's action key is a sha256 hex but no Action message's digest, so no size is "the"
# size; a server keys its ActionCache on (hash, size_bytes) and only needs both fixed and
# valid. BuildGrid 0.4.4 accepts any size (its LRU cache keys on the pair, and looks for an
# Action blob of that digest only to refresh it). Not 0: that is the empty blob's size, which
# servers treat specially. 32: the size of the key's own digest bytes.
AC_SIZE_BYTES = 32
IDENTITY, ZSTD = re_pb2.Compressor.IDENTITY, re_pb2.Compressor.ZSTD
_log = logging.getLogger(__name__)


class GrpcTransport:
    def __init__(self, settings: CacheSettings) -> None:
        self._c = GrpcChannel(settings)
        self._ac = re_grpc.ActionCacheStub(self._c.channel)
        self._cas = re_grpc.ContentAddressableStorageStub(self._c.channel)
        self._bytes = bytestream_pb2_grpc.ByteStreamStub(self._c.channel)
        self._capabilities = re_grpc.CapabilitiesStub(self._c.channel)
        self._instance = self._c.instance
        self._prefix = f"{self._instance}/" if self._instance else ""
        self._shown = settings.shown
        self._want_zstd = settings.compression == "zstd"
        if self._want_zstd:
            _require_zstandard()
        self._support: Support | None = None  # where the server takes zstd, once asked
        self._asked = not self._want_zstd
        self._asking = threading.Lock()

    @property
    def compression(self) -> str:
        """"zstd" once the server was found to take it (at the first blob), else "none"."""
        return "zstd" if self._support is not None else "none"

    # -- the Transport protocol ------------------------------------------------------

    def head(self, path: str) -> int | None:
        kind, name = _split(path)
        if kind == "cas":  # FindMissingBlobs cannot say a size, only check one
            raise RemoteError(Problem.PROTOCOL, "a gRPC CAS needs a blob's size to find it")
        raw = self._action_result(name)
        return None if raw is None else len(raw)

    def get(self, path: str, sink: Sink, limit: int | None = None) -> int | None:
        kind, name = _split(path)
        if kind == "ac":
            raw = self._action_result(name)
            if raw is None:
                return None
            if limit is not None and len(raw) > limit:
                raise Oversized(limit, f"an ActionResult of {len(raw)} bytes, more than the "
                                f"{limit} expected")
            sunk(sink, raw)
            return len(raw)
        if limit is None:
            raise RemoteError(Problem.PROTOCOL, "a gRPC CAS needs a blob's size to read it")
        if limit <= BATCH_LIMIT:
            return self._batch_read(name, limit, sink)
        return self._stream_read(name, limit, sink)

    def put(self, path: str, body: Path | bytes, digest: str | None = None) -> int:
        kind, name = _split(path)
        if kind == "ac":
            assert isinstance(body, bytes), "an ActionResult is sent from memory"
            self._update_action_result(name, body)
            return len(body)
        size = body.stat().st_size if isinstance(body, Path) else len(body)
        if size <= BATCH_LIMIT:
            data = body.read_bytes() if isinstance(body, Path) else body
            _check(data, name)  # a CAS names blobs by hash: always checked, `digest` or not
            self._batch_update(name, data)
        else:
            self._stream_write(name, body, size)
        return size

    def missing(self, refs: Iterable[tuple[str, int]]) -> set[str]:
        """The digests of `refs` (hash, size) the CAS lacks: one round trip per thousand."""
        refs = list(refs)
        absent: set[str] = set()
        for start in range(0, len(refs), FIND_MISSING_MAX):
            part = refs[start:start + FIND_MISSING_MAX]
            request = re_pb2.FindMissingBlobsRequest(
                instance_name=self._instance, blob_digests=[_digest(h, s) for h, s in part])
            answer = self._unary(self._cas.FindMissingBlobs, request, "FindMissingBlobs")
            absent |= {d.hash for d in answer.missing_blob_digests}
        return absent

    # -- ActionCache -----------------------------------------------------------------

    def _action_result(self, key: str) -> bytes | None:
        request = re_pb2.GetActionResultRequest(instance_name=self._instance,
                                                action_digest=_digest(key, AC_SIZE_BYTES))
        try:
            entry = self._unary(self._ac.GetActionResult, request, "GetActionResult",
                                absent_ok=True)
        except Absent:
            return None
        # Deterministic: protobuf's canonical bytes, which are what reapi.py writes.
        return entry.SerializeToString(deterministic=True)

    def _update_action_result(self, key: str, raw: bytes) -> None:
        request = re_pb2.UpdateActionResultRequest(
            instance_name=self._instance, action_digest=_digest(key, AC_SIZE_BYTES),
            action_result=re_pb2.ActionResult.FromString(raw))
        self._unary(self._ac.UpdateActionResult, request, "UpdateActionResult", len(raw))

    # -- small blobs -----------------------------------------------------------------

    def _batch_read(self, sha: str, size: int, sink: Sink) -> int | None:
        zstd = self._zstd()
        request = re_pb2.BatchReadBlobsRequest(
            instance_name=self._instance, digests=[_digest(sha, size)],
            acceptable_compressors=[ZSTD] if zstd is not None and zstd.stream else [])
        try:
            answer = self._unary(self._cas.BatchReadBlobs, request, "BatchReadBlobs", size,
                                 absent_ok=True)
        except Absent:
            return None
        found = [r for r in answer.responses if r.digest.hash == sha]
        if len(found) != 1:
            raise RemoteError(Problem.PROTOCOL, "BatchReadBlobs answered for other blobs")
        error = self._blob_status(found[0].status.code, "BatchReadBlobs")
        if isinstance(error, Absent):
            return None
        if error is not None:
            raise error
        return self._inline(found[0], size, sink, request.acceptable_compressors)

    def _inline(self, found: re_pb2.BatchReadBlobsResponse.Response, size: int, sink: Sink,
                asked: Iterable[int]) -> int:
        """A batch answer's data into the sink, decompressed if it came compressed."""
        data = found.data
        if found.compressor == IDENTITY:
            if len(data) > size:
                raise Oversized(size, f"a blob of {len(data)} bytes, more than the {size} "
                                f"expected")
            sunk(sink, data)
            return len(data)
        if found.compressor != ZSTD or ZSTD not in asked:
            raise RemoteError(Problem.PROTOCOL, f"BatchReadBlobs answered with compressor "
                              f"{found.compressor}, not one asked for")
        from .grpc_zstd import Decompressing

        out = Decompressing(sink, size, CHUNK)
        out.feed(data)
        return out.total

    def _batch_update(self, sha: str, data: bytes) -> None:
        zstd = self._zstd()
        blob = re_pb2.BatchUpdateBlobsRequest.Request(digest=_digest(sha, len(data)), data=data)
        if zstd is not None and zstd.batch_update:
            from .grpc_zstd import compress

            blob.data, blob.compressor = compress(data), ZSTD
        request = re_pb2.BatchUpdateBlobsRequest(instance_name=self._instance, requests=[blob])
        answer = self._unary(self._cas.BatchUpdateBlobs, request, "BatchUpdateBlobs", len(data))
        codes = [r.status.code for r in answer.responses if r.digest.hash == sha]
        if len(codes) != 1:
            raise RemoteError(Problem.PROTOCOL, "BatchUpdateBlobs answered for other blobs")
        error = self._blob_status(codes[0], "BatchUpdateBlobs")
        if error is not None:
            raise _no_absent(error)

    def _blob_status(self, code: int, rpc: str) -> Exception | None:
        """One blob's status in a batch answer (google.rpc.Status: a bare code number)."""
        if code == grpc.StatusCode.OK.value[0]:
            return None
        named = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
        return status_error(named, rpc, self._c)

    # -- large blobs: ByteStream -----------------------------------------------------

    def _stream_read(self, sha: str, size: int, sink: Sink) -> int | None:
        zstd = self._zstd()
        packed = zstd is not None and zstd.stream
        request = bytestream_pb2.ReadRequest(
            resource_name=f"{self._prefix}{_blobs(packed)}/{sha}/{size}")
        call = self._bytes.Read(request, timeout=self._c.deadline(size),
                                metadata=self._c.metadata)
        if packed:
            from .grpc_zstd import Decompressing

            into: Counted | Decompressing = Decompressing(sink, size, CHUNK)
        else:
            into = Counted(sink, size)
        try:
            for answer in call:
                into.feed(answer.data)
        except grpc.RpcError as exc:
            error = self._c.error(exc, "ByteStream.Read", size)
            if isinstance(error, Absent):
                return None
            raise error from None
        finally:
            call.cancel()  # stops the server at once on Oversized or a local error; else a no-op
        return into.total

    def _stream_write(self, sha: str, body: Path | bytes, size: int) -> None:
        zstd = self._zstd()
        packed = zstd is not None and zstd.stream
        resource = f"{self._prefix}uploads/{uuid.uuid4()}/{_blobs(packed)}/{sha}/{size}"
        encode: Compressing | None = None
        if packed:
            from .grpc_zstd import Compressing

            encode = Compressing(size)
        with open(body, "rb") if isinstance(body, Path) else io.BytesIO(body) as f:
            upload = Upload(f, resource, sha, size, CHUNK, encode)
            future = self._bytes.Write.future(upload.requests(), timeout=self._c.deadline(size),
                                              metadata=self._c.metadata)
            upload.started(future)
            try:
                answer = future.result()
            except (grpc.RpcError, grpc.FutureCancelledError) as exc:
                if upload.corrupt is not None:
                    raise upload.corrupt from None
                if not isinstance(exc, grpc.RpcError):
                    raise RemoteError(Problem.PROTOCOL, "ByteStream.Write cancelled") from None
                raise _no_absent(self._c.error(exc, "ByteStream.Write", size)) from None
        if upload.corrupt is not None:
            raise upload.corrupt
        # A server that already has the blob may stop early; it then says the whole size, or
        # -1 for a compressed upload (which, completed, commits the bytes sent).
        if answer.committed_size not in ((size, upload.sent, -1) if packed else (size,)):
            raise RemoteError(Problem.PROTOCOL, f"ByteStream.Write committed "
                              f"{answer.committed_size} of {size} bytes")

    # -- compression -----------------------------------------------------------------

    def _zstd(self) -> Support | None:
        """Where blobs go zstd-compressed; None: nowhere (compression off, or a server
        without ZSTD). The server is asked once, by the first blob moved."""
        if not self._asked:
            with self._asking:
                if not self._asked:
                    self._support = self._ask_support()
                    self._asked = True
        return self._support

    def _ask_support(self) -> Support | None:
        from .grpc_zstd import Support

        request = re_pb2.GetCapabilitiesRequest(instance_name=self._instance)
        try:
            answer = self._unary(self._capabilities.GetCapabilities, request, "GetCapabilities")
        except RemoteError as exc:
            if exc.problem is not Problem.PROTOCOL:
                raise  # unreachable, refused, slow: as any call fails (and asked again)
            _log.debug("%s: no GetCapabilities (%s), blobs go uncompressed", self._shown,
                       exc.detail)
            return None
        support = Support.of(answer.cache_capabilities)
        if support.stream or support.batch_update:
            return support
        _log.debug("%s does not list ZSTD, blobs go uncompressed", self._shown)
        return None

    def _unary(self, method: grpc.UnaryUnaryMultiCallable, request: object, rpc: str,
               size: int = 0, absent_ok: bool = False) -> Any:
        """The answer; Absent on NOT_FOUND only where absence is an answer (`absent_ok`)."""
        try:
            return method(request, timeout=self._c.deadline(size), metadata=self._c.metadata)
        except grpc.RpcError as exc:
            error = self._c.error(exc, rpc, size)
            raise (error if absent_ok else _no_absent(error)) from None


def _blobs(packed: bool) -> str:
    """The resource names' kind of blob: `blobs`, or zstd's `compressed-blobs/zstd`."""
    return "compressed-blobs/zstd" if packed else "blobs"


def _require_zstandard() -> None:
    try:
        import zstandard  # noqa: F401
    except ImportError as exc:
        raise SpecError(SETTINGS_FILE, "cache.compression", f'"zstd" needs the zstandard '
                        f"package ({exc.name or exc} is missing): pip install "
                        f"'hefbuild[grpc]'") from None


def _split(path: str) -> tuple[str, str]:
    kind, _, name = path.partition("/")
    if kind not in ("ac", "cas") or not name:
        raise ValueError(f"not a cache path: {path!r}")
    return kind, name


def _digest(sha: str, size: int) -> re_pb2.Digest:
    return re_pb2.Digest(hash=sha, size_bytes=size)


def _check(data: bytes, digest: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise CorruptSource(digest, actual)


def _no_absent(error: Exception) -> Exception:
    """Where absence is no answer (a write, a presence check), NOT_FOUND is one we cannot use
    (e.g. an unknown instance)."""
    return RemoteError(Problem.PROTOCOL, f"gRPC NOT_FOUND on {error}") \
        if isinstance(error, Absent) else error
