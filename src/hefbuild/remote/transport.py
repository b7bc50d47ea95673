"""Moving bytes to and from a remote cache: HTTP (Bazel's cache protocol, http.py), the gRPC
Remote APIs (grpc_transport.py) or a shared folder (folder.py). All speak in cache paths
(`cas/<sha256>`, `ac/<key>`) and stream: a blob is never held whole in memory. What can
fail, and how it is said: problems.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from ..declare.settings import SETTINGS_FILE, CacheSettings
from ..errors import SpecError
from .problems import Sink


class Transport(Protocol):
    def head(self, path: str) -> int | None:
        """The entry's size in bytes (-1: present, size not given); None when absent."""

    def get(self, path: str, sink: Sink, limit: int | None = None) -> int | None:
        """Stream the entry into `sink`; its size, or None when absent. More than `limit`
        bytes is a PROTOCOL error: nothing past the limit reaches the sink."""

    def put(self, path: str, body: Path | bytes, digest: str | None = None) -> int:
        """Store `body`; with `digest`, only if its bytes hash to it (else CorruptSource)."""


class BatchedTransport(Transport, Protocol):
    """A transport that checks many blobs' presence in one round trip (gRPC's CAS, which
    also needs each blob's size to find it: `head` cannot ask for a `cas/` path)."""

    def missing(self, refs: list[tuple[str, int]]) -> set[str]:
        """The digests among `refs` (sha256, size) the cache lacks at that size."""


def transport_for(settings: CacheSettings) -> Transport:
    assert settings.remote is not None
    if settings.remote.startswith("file://"):
        from .folder import FolderTransport

        return FolderTransport(Path(settings.remote.removeprefix("file://")))
    if settings.remote.startswith(("grpc://", "grpcs://")):
        return _grpc(settings)
    from .http import HttpTransport  # sockets and TLS only for an HTTP cache

    return HttpTransport(settings)


def _grpc(settings: CacheSettings) -> Transport:
    # gRPC's core logs INFO lines (a server's GOAWAY, ...) on stderr, amid the build's
    # output; errors only, unless the user asks for more. Read once, as grpc is imported.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:  # grpcio and the REAPI classes only for a gRPC cache: an optional extra
        from .grpc_transport import GrpcTransport
    except ImportError as exc:
        raise SpecError(SETTINGS_FILE, "cache.remote", f"a grpc(s):// cache needs grpcio and "
                        f"buildgrid ({exc.name or exc} is missing): pip install "
                        f"'hefbuild[grpc]'") from None
    return GrpcTransport(settings)


def batched(transport: Transport) -> BatchedTransport | None:
    """The transport, when it checks many blobs at once."""
    return transport if hasattr(transport, "missing") else None  # type: ignore[return-value]
