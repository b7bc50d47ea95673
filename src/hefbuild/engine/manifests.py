"""Stage manifests as one invocation reads them: each parsed once while its file stays as it
was. Deciding a task read its own manifest and its upstream stages' five or six times over
(the decision, the key, the files the fast path lists, the verdict kept), and with 5000
tasks decided in full that JSON was a fifth of the time.

A manifest is published by a rename, so a new one is a new inode: the stat signature, taken
before the file is read, tells a parsed manifest from a replaced one (a replacement while
it is read shows as a different signature at the next look). What it returns is shared by
every caller of the invocation: read it, never change it.
"""

from __future__ import annotations

from typing import Any

from ..declare.filesig import ABSENT, stat_signature
from ..store.events import read_json


class ManifestReader:
    def __init__(self) -> None:
        self._seen: dict[str, tuple[bytes, dict[str, Any] | None]] = {}

    def read(self, path: str) -> dict[str, Any] | None:
        """The JSON object at `path`, None when there is none (absent, unreadable, not an
        object)."""
        signature = stat_signature(path)
        seen = self._seen.get(path)
        if seen is not None and seen[0] == signature and signature != ABSENT:
            return seen[1]
        value = read_json(path)
        self._seen[path] = (signature, value)
        return value
