"""`doit explain TASK...`: why each task would run, or that it is up to date."""

from __future__ import annotations

import sys
from pathlib import Path

from doit.cmd_base import DoitCmdBase
from doit.exceptions import InvalidCommand

from ..errors import HefbuildError


class Explain(DoitCmdBase):
    name = "explain"
    doc_purpose = "say why a hefbuild task would run (what changed since its last build)"
    doc_usage = "TASK [TASK ...]"
    doc_description = None
    cmd_options = ()

    def _execute(self, pos_args: list[str] | None = None) -> int:
        from ..explain import explain_task
        from ..session import engine_for

        if not pos_args:
            raise InvalidCommand("explain needs at least one task name, e.g. verify:tiny-llama")
        # doit has changed into the dodo.py folder by now: that is the project root.
        engine = engine_for(str(Path.cwd().absolute()))
        for task in pos_args:
            if task not in engine.actions:
                raise InvalidCommand(f"'{task}' is not a hefbuild stage task (see `doit list`)")
            try:
                lines = explain_task(engine, task)
            except HefbuildError as exc:
                lines = [f"{task}: would fail: {exc}"]
            self.outstream.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        return 0
