"""The project and engine of this doit process, loaded once and shared by the tasks, the
file checker, the reporter and the extra commands (keyed by project root)."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from .project import Project, load_project


@cache
def project_at(root: str) -> Project:
    return load_project(Path(root))


@cache
def engine_for(root: str):  # noqa: ANN201 - Engine is imported lazily to keep `list` fast
    from .engine import Engine

    return Engine(project_at(root), progress=_to_terminal)


def _to_terminal(line: str) -> None:
    """Heartbeats reach the person at the terminal at once (doit buffers task stdout)."""
    print(line, file=sys.__stderr__, flush=True)
