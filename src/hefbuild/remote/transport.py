"""Moving bytes to and from a remote cache: HTTP (Bazel's cache protocol, http.py) or a shared
folder (folder.py). Both speak in cache paths (`cas/<sha256>`, `ac/<key>`) and stream: a
blob is never held whole in memory. What can fail, and how it is said: problems.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..declare.settings import CacheSettings
from .problems import Sink


class Transport(Protocol):
    def head(self, path: str) -> int | None:
        """The entry's size in bytes (-1: present, size not given); None when absent."""

    def get(self, path: str, sink: Sink, limit: int | None = None) -> int | None:
        """Stream the entry into `sink`; its size, or None when absent. More than `limit`
        bytes is a PROTOCOL error: nothing past the limit reaches the sink."""

    def put(self, path: str, body: Path | bytes, digest: str | None = None) -> int:
        """Store `body`; with `digest`, only if its bytes hash to it (else CorruptSource)."""


def transport_for(settings: CacheSettings) -> Transport:
    assert settings.remote is not None
    if settings.remote.startswith("file://"):
        from .folder import FolderTransport

        return FolderTransport(Path(settings.remote.removeprefix("file://")))
    from .http import HttpTransport  # sockets and TLS only for an HTTP cache

    return HttpTransport(settings)


