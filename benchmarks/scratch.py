"""What the transfer benchmarks share around their race: the tools they need, and a scratch
folder removed afterwards. Imports nothing of hefbuild (transfers_revs.py's driver must not:
each revision it races imports its own)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def in_scratch(name: str, race: Callable[[Path], None]) -> int:
    """`race(folder)` in a new scratch folder, or one line saying what is missing; 0."""
    missing = [tool for tool in ("nginx", "curl") if shutil.which(tool) is None]
    if missing:
        print(f"{name}: {' and '.join(missing)} not installed (.ci/setup installs them)")
        return 0
    work = Path(tempfile.mkdtemp(prefix=f"hefbuild-{name}-"))
    try:
        race(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0
