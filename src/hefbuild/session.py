"""The project and engine of this doit process, loaded once and shared by the tasks, the
file checker, the reporter and the extra commands (keyed by project root)."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from .plan import Action, plan_project
from .project import Project
from .projectcache import load_project_cached


@cache
def project_at(root: str) -> Project:
    return load_project_cached(Path(root))


@cache
def actions_at(root: str) -> dict[str, Action]:
    """The plan, made once per process for the task loader and the engine alike."""
    return plan_project(project_at(root))


@cache
def engine_for(root: str):  # noqa: ANN201 - Engine is imported lazily to keep `list` fast
    from .engine import Engine

    return Engine(project_at(root), progress=_to_terminal, actions=actions_at(root))


def _to_terminal(line: str) -> None:
    """Heartbeats reach the person at the terminal at once (doit buffers task stdout)."""
    print(line, file=sys.__stderr__, flush=True)
