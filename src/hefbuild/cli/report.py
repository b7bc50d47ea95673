"""`doit report`: write build/report/index.html (chains, check figures, history)."""

from __future__ import annotations

import sys
from pathlib import Path

from doit.exceptions import InvalidCommand

from ..errors import HefbuildError
from .command import HelpfulDoitCmd


class Report(HelpfulDoitCmd):
    name = "report"
    doc_purpose = "write build/report/index.html: each model's chain, its check figures, history"
    doc_usage = ""
    doc_description = ("One self-contained page (no network), read from build/: the "
                       "manifests, failed and running logs, check reports and event logs. "
                       "The trace of the last invocation is build/trace.json.")
    cmd_options = ()

    def _execute(self, pos_args: list[str] | None = None) -> int:
        from ..report.write import write_report  # only this command pays for the report code

        if pos_args:
            raise InvalidCommand(f"report takes no arguments, got {' '.join(pos_args)}")
        # doit has changed into the dodo.py folder by now: that is the project root.
        try:
            path = write_report(Path.cwd().absolute())
        except HefbuildError as exc:
            raise InvalidCommand(str(exc)) from exc
        except OSError as exc:
            raise InvalidCommand(f"report: cannot write build/report/: {exc}") from exc
        self.outstream.write(f"{path}\n")
        sys.stdout.flush()
        return 0
