"""Content digests and the canonical JSON that every key is computed from."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


@dataclass(frozen=True, order=True)
class Digest:
    """A SHA-256 digest as 64 lowercase hex characters."""

    hex: str

    def __post_init__(self) -> None:
        # strip leaves nothing exactly when every character is a lowercase hex digit
        if len(self.hex) != 64 or self.hex.strip("0123456789abcdef"):
            raise ValueError(f"not a sha256 hex digest: {self.hex!r}")

    def __str__(self) -> str:
        return self.hex

    @property
    def short(self) -> str:
        return self.hex[:12]


def sha256_bytes(data: bytes) -> Digest:
    return Digest(hashlib.sha256(data).hexdigest())


def sha256_file(path: Path) -> Digest:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return Digest(h.hexdigest())


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only: one spelling per value.

    Floats go through `repr` (shortest round-trip form), so 0.1 is always "0.1".
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
