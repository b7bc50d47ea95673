"""What a test session builds once for all its pytest-xdist workers.

A session-scoped fixture is made once per worker: with two workers, the tiny chain a dozen
e2e files read was trained and built twice. `once_per_session` builds a folder the first
time any worker asks for it (under a file lock, in the folder every worker's base temp
sits in) and hands the same folder to every later asker. Readers copy what they may change:
the folder is shared, so nothing may write to it after it is built.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def session_root(factory: pytest.TempPathFactory) -> Path:
    base = factory.getbasetemp()
    # Under xdist each worker's base temp is <session>/popen-gwN; alone, it is the session's.
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "session-once"


def once_per_session(factory: pytest.TempPathFactory, name: str,
                     build: Callable[[Path], None]) -> Path:
    """`build(folder)` the first time a worker of this session asks for `name`; the folder."""
    root = session_root(factory)
    root.mkdir(exist_ok=True)
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (root / f"{name}.done").exists():
            if folder.exists():  # a worker that failed or died in the middle of building it
                shutil.rmtree(folder)
            folder.mkdir()
            build(folder)
            (root / f"{name}.done").touch()
    return folder
