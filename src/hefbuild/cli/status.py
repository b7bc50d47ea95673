"""`doit status [MODEL ...]`: what a build would do to every task, and why."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import HefbuildError
from .command import HelpfulCommand


class Status(HelpfulCommand):
    name = "status"
    doc_purpose = ("every model x stage: up to date, would restore, would build (and the first "
                   "reason), never built, running (and its log)")
    doc_usage = "[MODEL ...]"
    doc_description = None
    cmd_options = ()

    def execute(self, opt_values: dict, pos_args: list[str]) -> int:
        from ..declare.project import find_root
        from ..report.explain import running_log, status_of
        from ..report.status import details, grid, totals
        from .session import engine_for, project_at

        try:
            root = find_root(Path.cwd())
            project = project_at(str(root))
            engine = engine_for(str(root))
        except HefbuildError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 3
        names = pos_args or sorted(project.models)
        unknown = [n for n in names if n not in project.models and n not in project.broken]
        if unknown:
            print(f"ERROR: no model {unknown[0]!r} in models/ (known: "
                  f"{', '.join(sorted(project.models))})", file=sys.stderr)
            return 3
        if not pos_args:  # as doit says it of a bad model file: one line, then the others
            for error in project.broken.values():
                print(f"WARNING: {error} (its tasks are left out)", file=sys.stderr)
        models, every, running = {}, [], {}
        for name in names:
            if name in project.broken:
                continue
            tasks = [a.task for a in engine.actions.values() if a.model == name]
            statuses = [status_of(engine, t) for t in tasks]
            models[name] = (project.models[name].target, statuses)
            every += statuses
            for t in tasks:
                log = running_log(engine, t)
                if log is not None:
                    running[t] = str(log.relative_to(root))
        out = grid(models, running) + details(every, running)
        out += [f"   {n}: refused: {project.broken[n]}" for n in names if n in project.broken]
        out.append(f"hefbuild status: {totals(every)}")
        print("\n".join(out))
        return 0
