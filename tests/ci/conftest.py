"""Fixtures of the CI tests: a normal user and a scratch folder it owns."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .as_user import User, normal_user


@pytest.fixture(scope="session")
def user() -> User:
    return normal_user()


@pytest.fixture
def workdir(user: User) -> Iterator[Path]:
    """Under /tmp (pytest's own folders are root's, mode 0700), owned by the user."""
    path = Path(tempfile.mkdtemp(prefix="hefbuild-ci-", dir="/tmp"))
    path.chmod(0o755)
    user.owns(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
