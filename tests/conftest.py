"""Shared by every test tier: `tests/` on sys.path, so `fakes` imports the same way whether
or not `tests/` itself is a package."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# A minimal project on disk and a loader of `models/m.toml` (declare/, plan/ and others), and
# which tests share a pytest-xdist worker and which start first (tests/scheduling.py).
from project_fixtures import load, model, proj  # noqa: E402, F401
from scheduling import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    pytest_xdist_make_scheduler,
)

