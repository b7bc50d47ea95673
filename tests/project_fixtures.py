"""A minimal project on disk: `toolchain/host.toml`, the data files the defaults name, and a
helper that writes `models/m.toml` and loads the project."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from samples import HOST_TOML

from hefbuild.declare.project import Project, load_project
from hefbuild.declare.specs import ModelSpec


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    for rel in ("data/calibration/tiny-stories.txt", "data/corpus/tiny-stories.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("Once upon a time.\n")
    (root / "models").mkdir()
    (root / "toolchain").mkdir()
    (root / "toolchain" / "host.toml").write_text(HOST_TOML)
    return root


@pytest.fixture
def load(proj: Path, tmp_path: Path) -> Callable[[str], Project]:
    """Write `models/m.toml` (unless text is None) and load the whole project."""

    def load(text: str | None = None) -> Project:
        if text is not None:
            (proj / "models" / "m.toml").write_text(text)
        return load_project(proj, store=tmp_path / "store")

    return load


@pytest.fixture
def model(load: Callable[[str], Project]) -> Callable[[str], ModelSpec]:
    return lambda text: load(text).models["m"]
