"""Fixtures of the CI tests: a normal user and scratch folders it owns."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .as_user import User, normal_user


@pytest.fixture(scope="session")
def user() -> User:
    return normal_user()


@contextmanager
def owned_folder(user: User, prefix: str) -> Iterator[Path]:
    """Under /tmp (pytest's own folders are root's, mode 0700), owned by the user, removed
    afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    user.owns(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pip_cache(user: User) -> Iterator[Path]:
    """pip's downloads, shared by every install of these tests (a runner's pip cache): no
    install downloads a wheel twice. (Most of an install's minute is pip compiling every
    module to bytecode, which no cache saves.)"""
    with owned_folder(user, "hefbuild-ci-pip-") as path:
        yield path


@pytest.fixture
def workdir(user: User) -> Iterator[Path]:
    with owned_folder(user, "hefbuild-ci-") as path:
        yield path
