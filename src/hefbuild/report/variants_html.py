"""A recipe sweep as HTML: one table of the parameters that differ and the stages, and one
of check figures, one column per model of the sweep (variants.py makes the rows). Every
name and value is escaped."""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from .model import MEAN, FigureRow, ParamRow, StageCell, StageComparison, Sweep
from .summary import human_bytes

KEY_SHOWN = 12
CSS = """
section.sweep{background:#fff;border:1px solid #d8dbe0;border-radius:8px;margin:16px auto}
tr.shared td.stage::after{content:" shared";color:#1565c0;font-size:12px;font-weight:600}
td.best{font-weight:700}
tr.param td{background:#f3f6fc}tr.param td.stage{font-family:ui-monospace,Menlo,monospace}
"""


def sweeps_html(sweeps: Iterable[Sweep]) -> str:
    return "\n".join(sweep_html(s) for s in sweeps)


def sweep_html(s: Sweep) -> str:
    name = escape(s.model)
    head = "".join(f'<th data-column="{escape(c)}">{escape(c)}</th>' for c in s.columns)
    parts = [f'<section class="sweep" id="sweep-{name}" data-sweep="{name}">',
             f"<h2>{name}: recipe sweep, {len(s.columns)} side by side</h2>",
             '<p class="muted">First the parameters that differ between the columns; then '
             "each stage: the time its rule took when the result was built, the size of its "
             "outputs and its key. A stage marked shared has one key in every column: it was "
             "built once and restored for the others.</p>",
             f'<table class="sweep-stages"><tr><th>stage</th>{head}</tr>'
             + "".join(_param_row(r) for r in s.params)
             + "".join(_stage_row(r) for r in s.stages) + "</table>"]
    if s.figures:
        parts.append(f'<table class="sweep-checks"><tr><th>check</th><th>prompt</th>'
                     f"<th>figure</th>{head}</tr>"
                     + "".join(_figure_row(r) for r in s.figures)
                     + "".join(_verdict_row(stage, v) for stage, v in s.passed
                               if any(x is not None for x in v)) + "</table>")
    return "\n".join(parts) + "\n</section>"


def _param_row(row: ParamRow) -> str:
    name = escape(f"{row.stage}.{row.name}")
    cells = "".join(f"<td>{escape(v)}</td>" for v in row.values)
    return f'<tr class="param" data-param="{name}"><td class="stage">{name}</td>{cells}</tr>'


def _stage_row(row: StageComparison) -> str:
    shared = ' class="shared"' if row.shared else ""
    cells = "".join(_stage_cell(c) for c in row.cells)
    return (f'<tr data-stage="{escape(row.stage)}"{shared}><td class="stage">'
            f"{escape(row.stage)}</td>{cells}</tr>")


def _stage_cell(c: StageCell) -> str:
    if c.key is None:
        return f'<td class="muted">{escape(c.state)}</td>'
    seconds = "–" if c.seconds is None else f"{c.seconds:.2f} s"
    size = "–" if c.size is None else human_bytes(c.size)
    return (f'<td data-key="{escape(c.key)}">{escape(c.state)}, {seconds}, {size}<br>'
            f'<span class="mono muted">{escape(c.key[:KEY_SHOWN])}</span></td>')


def _figure_row(row: FigureRow) -> str:
    known = [v for v in row.values if v is not None]
    best = max(known) if len(set(known)) > 1 else None  # no winner among equals
    cells = "".join(
        '<td class="num">–</td>' if v is None else
        f'<td class="num{" best" if v == best else ""}">{v:.3f}</td>' for v in row.values)
    prompt = "mean" if row.prompt == MEAN else escape(row.prompt)
    return (f'<tr data-check="{escape(row.check)}"><td>{escape(row.check)}</td>'
            f"<td>{prompt}</td><td>{escape(row.figure)}</td>{cells}</tr>")


def _verdict_row(stage: str, verdicts: tuple[bool | None, ...]) -> str:
    words = {True: "passed", False: "FAILED", None: "–"}
    cells = "".join(f"<td>{words[v]}</td>" for v in verdicts)
    return f"<tr><td>{escape(stage)}</td><td></td><td>verdict</td>{cells}</tr>"
