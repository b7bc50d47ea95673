"""SHA-256 of every file under a folder, for byte-identity checks in tests."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
