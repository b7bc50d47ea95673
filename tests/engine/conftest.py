"""A temp project (tiny-llama, dummy rules, host toolchain without packages), a temp store,
and a FakeExecutor in place of every rule."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine

from .helpers import TASKS, make_tiny_project, run_all
from .oracle import assert_oracle


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A private dir on tmpfs when there is one: the engine fsyncs its store and stat cache,
    which on a busy disk would make these tests slow."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="hefbuild-test-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root(workdir: Path) -> Path:
    return make_tiny_project(workdir / "proj")


@pytest.fixture
def store(workdir: Path) -> Path:
    return workdir / "store"


@pytest.fixture
def fake() -> FakeExecutor:
    return FakeExecutor()


@pytest.fixture
def make_engine(root: Path, store: Path, fake: FakeExecutor) -> Callable[..., Engine]:
    """A new Engine on the project as it is on disk now (reloads the TOML)."""

    def make(executor: FakeExecutor | None = None) -> Engine:
        return Engine(load_project(root, store=store), executor=executor or fake)

    return make


@pytest.fixture
def built(make_engine: Callable[..., Engine], fake: FakeExecutor) -> Engine:
    """The project after one full build; the executor's record is then cleared."""
    engine = make_engine()
    assert run_all(engine) == ["built"] * len(TASKS)
    fake.ran.clear()
    return engine


@pytest.fixture
def oracle(root: Path, store: Path) -> Callable[[], None]:
    return lambda: assert_oracle(root, store)
