"""`doit report`: write build/report/index.html (chains, check figures, history);
`doit report --variants <model>`: print that model's recipe sweep in the terminal."""

from __future__ import annotations

import sys
from pathlib import Path

from doit.exceptions import InvalidCommand

from ..errors import HefbuildError
from .command import HelpfulDoitCmd

OPT_VARIANTS = {
    "name": "variants", "long": "variants", "type": str, "default": "", "metavar": "MODEL",
    "help": "print MODEL's recipe sweep (it and its variants side by side: the parameters "
            "that differ, each stage, each check) instead of writing the page",
}


class Report(HelpfulDoitCmd):
    name = "report"
    doc_purpose = "write build/report/index.html: each model's chain, its check figures, history"
    doc_usage = "[--variants MODEL]"
    doc_description = ("One self-contained page (no network), read from build/: the "
                       "manifests, failed and running logs, check reports and event logs. "
                       "The trace of the last invocation that ran something is "
                       "build/trace.json (the last five: build/traces/).")
    cmd_options = (OPT_VARIANTS,)

    def _execute(self, variants: str, pos_args: list[str] | None = None) -> int:
        from ..report.write import write_report  # only this command pays for the report code

        if pos_args:
            raise InvalidCommand(f"report takes no arguments, got {' '.join(pos_args)}")
        # doit has changed into the dodo.py folder by now: that is the project root.
        if variants:
            return self._sweep(variants)
        try:
            path = write_report(Path.cwd().absolute())
        except HefbuildError as exc:
            raise InvalidCommand(str(exc)) from exc
        except OSError as exc:
            raise InvalidCommand(f"report: cannot write build/report/: {exc}") from exc
        self.outstream.write(f"{path}\n")
        sys.stdout.flush()
        return 0

    def _sweep(self, model: str) -> int:
        from ..report.variants_text import sweep_text

        try:
            self.outstream.write(sweep_text(Path.cwd().absolute(), model))
        except HefbuildError as exc:
            raise InvalidCommand(str(exc)) from exc
        return 0
