"""`doit explain TASK...`: why each task would run, or that it is up to date.

A TASK is a stage task (`export:tiny-llama`), a target's artifact alias (`<alias>:<model>`:
the stage that makes it), or a group (a stage: every model's). Works from any folder of
the project: it needs no dodo.py loaded, only the project it finds up the tree.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

from ..errors import HefbuildError
from .command import HelpfulCommand


class Explain(HelpfulCommand):
    name = "explain"
    doc_purpose = "say why a hefbuild task would run (what changed since its last build)"
    doc_usage = "TASK [TASK ...]   (a stage task, an artifact alias, or a group: a stage)"
    doc_description = None
    cmd_options = ()

    def execute(self, opt_values: dict, pos_args: list[str]) -> int:
        from ..declare.project import find_root
        from ..report.explain import explain_task
        from .session import engine_for

        if not pos_args:
            print("ERROR: explain needs at least one task name, e.g. verify:tiny-llama",
                  file=sys.stderr)
            return 3
        try:
            engine = engine_for(str(find_root(Path.cwd())))
        except HefbuildError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 3
        tasks = []
        for name in pos_args:
            found = resolve(name, list(engine.actions), artifact_aliases(engine))
            if isinstance(found, str):
                print(f"ERROR: {found}", file=sys.stderr)
                return 3
            tasks += found
        for task in tasks:
            try:
                lines = explain_task(engine, task)
            except HefbuildError as exc:
                lines = [f"{task}: would fail: {exc}"]
            print("\n".join(lines))
        return 0


def artifact_aliases(engine: Any) -> dict[str, str]:
    """alias -> the stage that makes the artifact, as the project's targets declare them."""
    arts = (m.pipeline.artifact for m in engine.project.models.values())
    return {a.alias: a.stage for a in arts if a and a.alias}


def resolve(name: str, known: list[str],
            aliases: dict[str, str] | None = None) -> list[str] | str:
    """The stage tasks a name means, or the one-line reason it means none."""
    if name in known:
        return [name]
    base, _, model = name.partition(":")
    stage = (aliases or {}).get(base)
    if stage and f"{stage}:{model}" in known:
        return [f"{stage}:{model}"]
    group = [t for t in known if t.split(":", 1)[0] == name]
    if group:
        return group
    close = difflib.get_close_matches(name, known + sorted({t.split(':')[0] for t in known}),
                                      n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else " (see `doit list`)"
    return f"'{name}' is not a hefbuild stage task, alias or group{hint}"
