"""The project and engine of this doit process, loaded once and shared by the tasks, the
file checker, the reporter and the extra commands (keyed by project root)."""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

from ..declare.project import Project
from ..engine.fastpath import FastPath, fast_path_of
from ..plan.actions import Action, plan_project
from ..plan.projectcache import load_project_cached
from . import gcpause


@cache
def project_at(root: str) -> Project:
    return load_project_cached(Path(root))


_only: dict[str, set[str]] = {}  # root -> the models this invocation needs, when known


def only_models(root: str, models: set[str] | None) -> None:
    """Plan only these models in this process (see `selection`); None: all of them."""
    if models is not None:
        _only[root] = models


@cache
def planned_at(root: str) -> Project:
    """The project with only the models this invocation needs (all when not known): only
    theirs are read from the project cache (`plan/lazymodels.py`)."""
    project = project_at(root)
    if root in _only:
        models = project.models
        project = replace(project, models={n: models[n] for n in models if n in _only[root]})
    return project


@cache
def actions_at(root: str) -> dict[str, Action]:
    """The plan, made once per process for the task loader and the engine alike."""
    return plan_project(planned_at(root))


@cache
def fast_path_at(root: str) -> FastPath:
    """The last verdicts, answered without the engine (whose import a no-op never pays)."""
    return fast_path_of(project_at(root))


@cache
def engine_for(root: str):  # noqa: ANN201 - Engine is imported lazily to keep `list` fast
    from ..engine.engine import Engine

    gcpause.resume()  # the engine decides or runs something: collection as before
    engine = Engine(project_at(root), progress=_to_terminal, actions=actions_at(root),
                    fast=fast_path_at(root))
    engine.stream_logs = verbosity(sys.argv[1:]) >= 2
    _engines.append(engine)
    return engine


_engines: list = []  # those engine_for made, for `close_engines`


def close_engines() -> None:
    """The engines' stat caches closed (and their SQLite checkpointed) at the end of a run:
    the module-level caches that hold them are frozen out of the collection at exit that
    would otherwise close them (cli/gcpause.py). A later use opens them again."""
    for engine in _engines:
        engine.stats.close()


def forced(task: str, argv: list[str]) -> bool:
    """`doit -a TASK` rebuilds TASK itself, as in doit; its dependencies are still
    restored or left as they are (re-running a 4-hour compile to re-check a device
    is never what `-a verify:x` means)."""
    if "-a" not in argv and "--always-execute" not in argv:
        return False
    named = {a for a in argv if not a.startswith("-")}
    return task in named or task.split(":")[0] in named


def verbosity(argv: list[str]) -> int:
    """doit's `-v N` / `--verbosity N` / `-vN` (0 when absent)."""
    return int_option(argv, "-v", "--verbosity")


def processes(argv: list[str]) -> int:
    """doit's `-n N` / `--process N` / `-nN`: how many tasks may run at once (0: serial)."""
    return int_option(argv, "-n", "--process")


def int_option(argv: list[str], short: str, long: str) -> int:
    """An integer option of doit's run command line, as `short N`, `long N`, `long=N` or
    `shortN` (0 when absent or not a number)."""
    for i, token in enumerate(argv):
        if token in (short, long) and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(f"{long}="):
            value = token.split("=", 1)[1]
        elif token.startswith(short) and token[len(short):].isdigit():
            value = token[len(short):]
        else:
            continue
        return int(value) if value.isdigit() else 0
    return 0


def _to_terminal(line: str) -> None:
    """Heartbeats reach the person at the terminal at once (doit buffers task stdout)."""
    print(line, file=sys.__stderr__, flush=True)
