"""Engines on two machines' worth of state (a project, a store) sharing one remote cache."""

from __future__ import annotations

from pathlib import Path

from engine.helpers import MODEL, TASKS, make_tiny_project, run_all
from fakes.fake_executor import FakeExecutor

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine

__all__ = ["MODEL", "TASKS", "cache_toml", "engine", "make_project", "run_all"]


def make_project(root: Path, settings: str) -> Path:
    """A tiny-llama project (the FakeExecutor runs no rule) with this hefbuild.toml."""
    make_tiny_project(root)
    (root / "hefbuild.toml").write_text(settings)
    return root


def engine(root: Path, store: Path, fake: FakeExecutor) -> Engine:
    return Engine(load_project(root, store=store), executor=fake)


def cache_toml(url: str, upload: bool = False, extra: str = "") -> str:
    return f'[cache]\nremote = "{url}"\nupload = {str(upload).lower()}\ntimeout = "3s"\n{extra}'
