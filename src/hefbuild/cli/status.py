"""`doit status [NAME ...]`: what a build would do to every task, and why.

A NAME is a model (its row in the grid) or what `doit explain` takes: a stage task, an
artifact alias or a group (one line per task). A model file that does not load, named,
is its one error line and exit 3, as a run naming it is.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

from ..errors import HefbuildError
from .command import HelpfulCommand


class Status(HelpfulCommand):
    name = "status"
    doc_purpose = ("every model x stage: up to date, would restore, would build (and the first "
                   "reason), never built, failed (why, and its log), running (and its log)")
    doc_usage = "[MODEL | TASK ...]   (a model, or a stage task, alias or group as explain takes)"
    doc_description = None
    cmd_options = ()

    def execute(self, opt_values: dict, pos_args: list[str]) -> int:
        from ..declare.project import find_root
        from .session import engine_for, project_at

        try:
            root = find_root(Path.cwd())
            project = project_at(str(root))
            engine = engine_for(str(root))
        except HefbuildError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 3
        named = names_of(pos_args, project, engine)
        if isinstance(named, str):
            print(f"ERROR: {named}", file=sys.stderr)
            return 3
        if not pos_args:  # as doit says it of a bad model file: one line, then the others
            for error in project.broken.values():
                print(f"WARNING: {error} (its tasks are left out)", file=sys.stderr)
        print("\n".join(status_lines(root, project, engine, *named)))
        return 0


def names_of(pos_args: list[str], project: Any,
             engine: Any) -> tuple[list[str], list[str]] | str:
    """(models, tasks) the words name, or the one-line reason a word names nothing."""
    from .explain import artifact_aliases, resolve

    if not pos_args:
        return sorted(project.models), []
    models: list[str] = []
    tasks: list[str] = []
    for name in pos_args:
        if name in project.broken:
            return project.broken[name]
        if name in project.models:
            models.append(name)
            continue
        found = resolve(name, list(engine.actions), artifact_aliases(engine))
        if isinstance(found, str):
            return _unknown(name, sorted(project.models), list(engine.actions))
        tasks += [t for t in found if t not in tasks]
    return models, tasks


def _unknown(name: str, models: list[str], tasks: list[str]) -> str:
    groups = sorted({t.split(":", 1)[0] for t in tasks})
    close = difflib.get_close_matches(name, models + groups + tasks, n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else f"models: {', '.join(models)}"
    return f"no model or task {name!r} in this project; {hint}"


def status_lines(root: Path, project: Any, engine: Any, models: list[str],
                 tasks: list[str]) -> list[str]:
    """The grid of the named models, a line per named task, the reasons and the totals."""
    from ..report.explain import running_log, status_of
    from ..report.status import details, grid, task_rows, totals

    rows, every, running = {}, [], {}
    for name in models:
        statuses = [status_of(engine, a.task) for a in engine.actions.values()
                    if a.model == name]
        rows[name] = (project.models[name].target, statuses)
        every += statuses
    named = [status_of(engine, t) for t in tasks]
    for s in every + named:
        log = running_log(engine, s.task)
        if log is not None:
            running[s.task] = str(log.relative_to(root))
    out = grid(rows, running) + details(every, running) if rows else []
    out += task_rows(named, running)
    out.append(f"hefbuild status: {totals(every + named)}")
    return out
