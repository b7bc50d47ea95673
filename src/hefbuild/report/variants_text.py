"""A recipe sweep in the terminal (`doit report --variants <model>`): the page's sweep
table as text, one column per model, the same rows in the same order (variants.py): the
parameters that differ first, then each stage (state, build time, output size, key), then
each check's figures and verdicts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import HefbuildError
from .model import MEAN, BuildReport, StageCell, Sweep
from .summary import human_bytes
from .variants import base_of

KEY_SHOWN = 8
PROMPT_MAX = 32  # a long prompt is cut: the page has it whole


def sweep_lines(s: Sweep) -> list[str]:
    rows: list[Sequence[str]] = [("", *s.columns)]
    rows += [(f"{p.stage}.{p.name}", *p.values) for p in s.params]
    rows.append(())
    rows += [(f"{r.stage}{' (shared)' if r.shared else ''}", *map(_cell, r.cells))
             for r in s.stages]
    if s.figures:
        rows.append(())
        rows += [(f"{f.check}, {'mean' if f.prompt == MEAN else _prompt(f.prompt)}: {f.figure}",
                  *("–" if v is None else f"{v:.3f}" for v in f.values)) for f in s.figures]
        words = {True: "passed", False: "FAILED", None: "–"}
        rows += [(f"{stage}: verdict", *(words[v] for v in verdicts))
                 for stage, verdicts in s.passed if any(v is not None for v in verdicts)]
    title = f"{s.model}: recipe sweep, {len(s.columns)} side by side"
    return [title, *_aligned(rows)]


def _cell(c: StageCell) -> str:
    if c.key is None:
        return c.state
    seconds = "–" if c.seconds is None else f"{c.seconds:.2f} s"
    size = "–" if c.size is None else human_bytes(c.size)
    return f"{c.state}, {seconds}, {size}, {c.key[:KEY_SHOWN]}"


def _prompt(text: str) -> str:
    text = " ".join(text.split())  # a prompt's newlines would break the table
    return text if len(text) <= PROMPT_MAX else text[:PROMPT_MAX - 1] + "…"


def _aligned(rows: list[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)).rstrip()
            for r in rows]


def sweep_text(root: Path, model: str) -> str:
    """The sweep of `model` (a base model, or one of its variants) in the project at `root`."""
    from .write import current_report

    report, _ = current_report(root)
    found = sweep_named(report, model)
    return "\n".join(sweep_lines(found)) + "\n"


def sweep_named(report: BuildReport, model: str) -> Sweep:
    for s in report.sweeps:
        if s.model == base_of(model):
            return s
    have = ", ".join(s.model for s in report.sweeps) or "none"
    raise HefbuildError(f"report --variants: no recipe sweep of {model!r} in build/ (a model "
                        f"with a variant built; here: {have})")
