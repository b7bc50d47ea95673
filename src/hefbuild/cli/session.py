"""The project and engine of this doit process, loaded once and shared by the tasks, the
file checker, the reporter and the extra commands (keyed by project root).

A no-op never loads the declarations: the task table (cli/tasktable.py) answers what the
tasks, the preflight and the reporter ask, and the project is loaded when something needs
more (a stage to decide or run, an upload to send, a command of its own)."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..declare.layout import STATE_DIR
from ..engine.fastpath import FastPath
from . import gcpause
from .tasktable import TaskTable, read_table

if TYPE_CHECKING:
    from ..declare.project import Project
    from ..plan.actions import Action


@cache
def project_at(root: str) -> Project:
    from ..plan.projectcache import load_project_cached

    return load_project_cached(Path(root))


_tables: dict[str, TaskTable] = {}  # root -> the table this invocation's tasks came from


def use_table(root: str, table: TaskTable) -> None:
    _tables[root] = table


def table_at(root: str) -> TaskTable:
    """The task table of this invocation (the one its tasks were made from), else the last
    one while it holds, else one made from the declarations; a model it lacks is added
    from the declarations when asked about (another process of a parallel run, a command
    of its own)."""
    if root in _tables:
        return _tables[root]
    table = read_table(root) or _made(root, [], None)
    table.fill = lambda models: _made(root, models, table)
    _tables[root] = table
    return table


def _made(root: str, models: list[str], table: TaskTable | None) -> TaskTable:
    from .tablemake import make_table

    return make_table(project_at(root), models, table)


_only: dict[str, set[str]] = {}  # root -> the models this invocation needs, when known


def only_models(root: str, models: set[str] | None) -> None:
    """Plan only these models in this process (see `selection`); None: all of them."""
    if models is not None:
        _only[root] = models


def run_models(root: str) -> list[str]:
    """The models of this invocation's tasks, in the declarations' order."""
    table = table_at(root)
    only = _only.get(root)
    return table.models if only is None else [m for m in table.models if m in only]


@cache
def planned_at(root: str) -> Project:
    """The project with only the models this invocation needs (all when not known): only
    theirs are read from the project cache (`plan/lazymodels.py`)."""
    from dataclasses import replace

    project = project_at(root)
    if root in _only:
        models = project.models
        project = replace(project, models={n: models[n] for n in models if n in _only[root]})
    return project


@cache
def actions_at(root: str) -> dict[str, Action]:
    """The plan, made once per process for the task loader and the engine alike."""
    from ..plan.actions import plan_project

    return plan_project(planned_at(root))


@cache
def fast_path_at(root: str) -> FastPath:
    """The last verdicts, answered without the engine (whose import a no-op never pays)
    or the declarations; stamps as `fast_path_of` computes them from the declarations."""
    return FastPath(Path(root) / STATE_DIR / "fastpath.bin", Path(root),
                    table_at(root).toolchain_stamp)


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
