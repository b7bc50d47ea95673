"""The build report as one self-contained HTML page: inline CSS and SVG, no script, no
network. Every text that comes from a build (prompts, generated text, errors) is escaped.

Links point at files of build/ relative to `build/report/index.html`, so the page works
from the folder it is in, copied as a CI artifact together with build/.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from .content import (
    KEY_SHOWN,
    PLOTTED,
    AgreementPoint,
    BuildReport,
    Check,
    CheckKind,
    ModelReport,
    PromptFigures,
    Run,
    Stage,
    StageHistory,
    StageState,
)
from .summary import summary_line
from .variants_html import CSS as SWEEP_CSS
from .variants_html import sweeps_html

COLOURS = {StageState.BUILT: "#2e7d32", StageState.RESTORED: "#1565c0",
           StageState.REMOTE: "#6a1b9a", StageState.FAILED: "#c62828",
           StageState.RUNNING: "#ef6c00", StageState.MISSING: "#9e9e9e"}
SERIES = ("#1f5fa8", "#e0791a")  # teacher-forced, then free-running (or device) agreement
FAILED = "#c62828"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;
background:#f6f7f9}
header,section,footer{max-width:1200px;margin:0 auto;padding:12px 24px}
header{border-bottom:1px solid #d8dbe0;background:#fff;max-width:none}
h1{font-size:22px;margin:4px 0}h2{font-size:19px;margin:18px 0 6px}
h3{font-size:15px;margin:16px 0 6px}
section.model{background:#fff;border:1px solid #d8dbe0;border-radius:8px;margin:16px auto}
.muted{color:#5f6368}.mono,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
table{border-collapse:collapse;margin:6px 0}th,td{padding:3px 10px;text-align:left;
vertical-align:top;border-bottom:1px solid #eceef1}th{background:#f0f2f5;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
ol.chain{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:4px;margin:8px 0}
ol.chain li{padding:4px 10px;border-radius:14px;color:#fff;font-weight:600}
ol.chain li.to{padding:4px 0;color:#5f6368;background:none}
.state{font-weight:600}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;color:#fff;
vertical-align:middle}
.pass{background:#2e7d32}.fail{background:#c62828}.fake{background:#b71c1c}.none{background:#9e9e9e}
.banner{padding:8px 12px;border-radius:6px;font-weight:600;margin:8px 0}
.banner.fake{background:#ffebee;border:2px solid #b71c1c;color:#b71c1c;font-size:16px}
.banner.failed{background:#fff3e0;border:1px solid #c62828;color:#8e1c1c}
.banner.estimate{background:#fffde7;border:1px solid #c9a400;color:#5d4a00}
dl.figures{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:6px 0}
dl.figures dt{color:#5f6368}dl.figures dd{margin:0;font-variant-numeric:tabular-nums}
pre.text{white-space:pre-wrap;word-break:break-word;margin:0;max-width:360px}
svg{display:block;margin:6px 0}svg text{font:11px system-ui,sans-serif;fill:#1d1d1f}
nav a{margin-right:14px}
"""


def render(report: BuildReport) -> str:
    """The whole page."""
    title = f"hefbuild report: {report.project}" if report.project else "hefbuild report"
    body = [_header(report, title), sweeps_html(report.sweeps)] + \
        [_model(m) for m in report.models] + [_footer(report)]
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>{CSS}{SWEEP_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _header(report: BuildReport, title: str) -> str:
    last = report.last_summary
    line = (f"last invocation ({escape(str(last.get('time', '')))}): "
            f"{escape(summary_line(last.get('summary') or {}))}" if last else "no invocation yet")
    nav = " ".join(f'<a href="#model-{escape(m.name)}">{escape(m.name)}</a> {_badge(m)}'
                   for m in report.models)
    return (f"<header><h1>{escape(title)}</h1>"
            f'<p class="muted">made {escape(report.made)}; {line}</p><nav>{nav}</nav></header>')


def _footer(report: BuildReport) -> str:
    parts = []
    if report.unbuilt:
        parts.append(f"Not built: {escape(', '.join(report.unbuilt))}.")
    if report.damaged_events:
        parts.append(f"{report.damaged_events} damaged event log lines skipped.")
    parts.append("Times are UTC. Keys are shown by their first 12 hex digits.")
    return f'<footer class="muted">{" ".join(parts)}</footer>'


def _badge(model: ModelReport) -> str:
    """The verdict of the target's check stage (its other reports are shown, not badged)."""
    check = next((c for c in model.checks if c.stage == model.check), None)
    if check is None:  # a check that failed before writing its report still failed
        failed = any(s.name == model.check and s.state is StageState.FAILED
                     for s in model.stages)
        return '<span class="badge fail">FAILED</span>' if failed else \
            '<span class="badge none">no check</span>'
    if check.fake_device:
        verdict = "passed" if check.passed else "FAILED"
        return f'<span class="badge fake">{verdict} on the TEST DOUBLE, not a device</span>'
    if check.passed:
        return '<span class="badge pass">passed</span>'
    return '<span class="badge fail">FAILED</span>'


def _model(m: ModelReport) -> str:
    name = escape(m.name)
    parts = [f'<section class="model" id="model-{name}" data-model="{name}">',
             f'<h2>{name} <span class="muted">({escape(m.target)})</span> {_badge(m)}</h2>',
             _chain(m.stages), _stage_table(m.stages)]
    parts += [_check(c) for c in m.checks]
    parts.append(_history(m))
    return "\n".join(parts) + "\n</section>"


# -- the chain -----------------------------------------------------------------------


def _chain(stages: Iterable[Stage]) -> str:
    items = '<li class="to" aria-hidden="true">→</li>'.join(
        f'<li style="background:{COLOURS[s.state]}" title="{escape(s.state.value)}">'
        f"{escape(s.name)}</li>" for s in stages)
    return f'<ol class="chain">{items}</ol>'


def _stage_table(stages: Iterable[Stage]) -> str:
    head = ("<tr><th>stage</th><th>outcome</th><th>last run</th><th>seconds</th>"
            "<th>build seconds</th><th>peak MiB</th><th>key</th><th>note</th></tr>")
    return f'<table class="stages">{head}{"".join(_stage_row(s) for s in stages)}</table>'


def _stage_row(s: Stage) -> str:
    note = escape(s.error or "")
    if s.log:
        note += f' <a href="{_href(s.log)}">{escape(s.log)}</a>'
    return (f'<tr data-stage="{escape(s.name)}"><td>{escape(s.name)}</td>'
            f'<td class="state" style="color:{COLOURS[s.state]}">{escape(s.state.value)}</td>'
            f"<td>{escape(s.last_run or '–')}</td><td class=\"num\">{_secs(s.seconds)}</td>"
            f'<td class="num">{_secs(s.build_seconds)}</td><td class="num">{_mib(s.peak_mb)}</td>'
            f'<td class="mono">{escape((s.key or "–")[:KEY_SHOWN])}</td><td>{note}</td></tr>')


# -- a check -------------------------------------------------------------------------

def _check(c: Check) -> str:
    title = f"{escape(c.stage)}: {escape(c.title)}" if c.title else escape(c.stage)
    parts = [f'<div class="check" data-check="{escape(c.stage)}" data-kind="{c.kind.value}">',
             f"<h3>{title}</h3>", *_banners(c)]
    verdict = {True: "passed", False: "FAILED", None: "reported"}[c.passed]
    parts.append(f'<p>{verdict}; figures from <a href="{_href(c.path)}">{escape(c.path)}</a>'
                 f"{'; key ' + escape(c.key[:KEY_SHOWN]) if c.key else ''}</p>")
    figures = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in c.figures)
    parts.append(f'<dl class="figures">{figures}</dl>')
    series = _series(c)
    if series and c.prompts:
        parts.append(bars_svg([p.prompt for p in c.prompts], series, c.threshold))
    parts.append(_prompt_table(c, series))
    return "\n".join(parts) + "</div>"


def _banners(c: Check) -> list[str]:
    out = []
    if c.fake_device:
        out.append(f'<p class="banner fake">{escape(_capital(c.answerer.double))} answered '
                   f"this check: these figures are NOT from {escape(c.answerer.real)}.</p>")
    if c.failed_run:
        out.append(f'<p class="banner failed">The last run of {escape(c.stage)} FAILED; these '
                   f"are the figures it wrote ({escape(c.path)}).</p>")
    if c.kind is CheckKind.ESTIMATE:
        out.append('<p class="banner estimate">An estimate: ONNX Runtime emulating the '
                   f"recipe's precisions on the CPU, not the device. {escape(c.note)}</p>")
    return out


def _series(c: Check) -> list[tuple[str, list[float | None]]]:
    """The plotted figures per prompt: the gated one first."""
    forced = [p.teacher_forced for p in c.prompts]
    free = [p.agreement for p in c.prompts]
    free_label = "device agreement" if c.kind is CheckKind.DEVICE else "free-running agreement"
    out = []
    if any(v is not None for v in forced):
        out.append(("teacher-forced agreement", forced))
    if any(v is not None for v in free):
        out.append((free_label, free))
    return out


def _prompt_table(c: Check, series: list[tuple[str, list[float | None]]]) -> str:
    texts = any(p.reference_text or p.generated_text for p in c.prompts)
    cosine = any(p.logit_cosine is not None for p in c.prompts)
    generated = "device text" if c.kind is CheckKind.DEVICE else "generated"
    head = "<tr><th>prompt</th>" + "".join(f"<th>{escape(la)}</th>" for la, _ in series) + \
        ("<th>logit cosine</th>" if cosine else "") + "<th>first divergence</th><th>passed</th>" + \
        (f"<th>reference (float32)</th><th>{generated}</th>" if texts else "") + \
        "<th>reason</th></tr>"
    rows = "".join(_prompt_row(p, [v[i] for _, v in series], texts, cosine)
                   for i, p in enumerate(c.prompts))
    return f'<table class="prompts">{head}{rows}</table>'


def _prompt_row(p: PromptFigures, values: list[float | None], texts: bool,
                cosine: bool) -> str:
    cells = "".join(f'<td class="num">{_ratio(v)}</td>' for v in values)
    passed = {True: "yes", False: "NO", None: "–"}[p.passed]
    divergence = "none" if p.first_divergence is None else str(p.first_divergence)
    text = (f'<td><pre class="text">{escape(p.reference_text)}</pre></td>'
            f'<td><pre class="text">{escape(p.generated_text)}</pre></td>') if texts else ""
    cosine_cell = f'<td class="num">{_ratio(p.logit_cosine, 4)}</td>' if cosine else ""
    return (f"<tr><td>{escape(p.prompt)}</td>{cells}{cosine_cell}"
            f'<td class="num">{divergence}</td><td>{passed}</td>{text}'
            f"<td>{escape(p.reason)}</td></tr>")


# -- history -------------------------------------------------------------------------


def _history(m: ModelReport) -> str:
    head = ("<tr><th>stage</th><th>builds</th><th>seconds per build, oldest first (the last "
            f"{PLOTTED})</th>"
            "<th>last</th><th>fastest</th><th>slowest</th><th>restored</th></tr>")
    rows = "".join(_history_row(h) for h in m.history if h.builds or h.reused)
    parts = ["<h3>History</h3>", f'<table class="history">{head}{rows}</table>' if rows else
             '<p class="muted">No build of this model in the event logs.</p>']
    if m.agreement:
        parts.append("<p>Mean agreement of each checked result, oldest first "
                     "(from build/report/history.jsonl):</p>")
        parts.append(agreement_svg(m.agreement))
    return "\n".join(parts)


def _history_row(h: StageHistory) -> str:
    built = [r.seconds for r in h.runs if r.outcome == "built"]  # a failure is no build time
    figures = (f'<td class="num">{_secs(built[-1])}</td><td class="num">{_secs(min(built))}</td>'
               f'<td class="num">{_secs(max(built))}</td>' if built else "<td></td>" * 3)
    return (f'<tr data-stage="{escape(h.stage)}"><td>{escape(h.stage)}</td>'
            f'<td class="num">{h.builds}</td><td>{sparkline_svg(h.runs)}</td>{figures}'
            f'<td class="num">{h.reused}</td></tr>')


# -- plots ---------------------------------------------------------------------------


def bars_svg(labels: list[str], series: list[tuple[str, list[float | None]]],
             threshold: float | None, width: int = 720) -> str:
    """Horizontal bars on a 0..1 scale, one group per label, one bar per series; the gate
    as a dashed line."""
    left, right, top, bar, gap = 230, 50, 26, 13, 3
    group = len(series) * (bar + gap) + 10
    plot = width - left - right
    height = top + group * len(labels) + 22
    out = [_svg_open(width, height, "agreement per prompt")]
    colours = [_colour(name) for name, _ in series]
    for j, (name, _) in enumerate(series):  # the legend
        x = left + j * 210
        out.append(f'<rect x="{x}" y="6" width="12" height="12" fill="{colours[j]}"/>'
                   f'<text x="{x + 16}" y="16">{escape(name)}</text>')
    for i, label in enumerate(labels):
        y = top + i * group
        out.append(f'<text x="{left - 8}" y="{y + group / 2 - 3:.1f}" text-anchor="end">'
                   f"<title>{escape(label)}</title>{escape(_short(label, 34))}</text>")
        for j, (_, values) in enumerate(series):
            out.append(_bar(values[i], left, y + j * (bar + gap), plot, bar, colours[j]))
    out += _axis(left, plot, top + group * len(labels))
    if threshold is not None:
        x = left + plot * _clip(threshold)
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" '
                   f'y2="{top + group * len(labels)}" stroke="{FAILED}" stroke-dasharray="4 3"/>'
                   f'<text x="{x + 3:.1f}" y="{top - 6}" fill="{FAILED}">gate {threshold:g}'
                   "</text>")
    return "".join(out) + "</svg>"


def _colour(series: str) -> str:
    """One colour per meaning across every plot of the page."""
    return SERIES[0] if series.startswith("teacher-forced") else SERIES[1]


def _bar(value: float | None, x: int, y: float, plot: int, bar: int, colour: str) -> str:
    if value is None:
        return f'<text x="{x + 4}" y="{y + bar - 2:.1f}" class="muted">–</text>'
    w = plot * _clip(value)
    return (f'<rect x="{x}" y="{y:.1f}" width="{w:.1f}" height="{bar}" fill="{colour}"/>'
            f'<text x="{x + w + 4:.1f}" y="{y + bar - 2:.1f}">{value:.3f}</text>')


def _axis(left: int, plot: int, y: int) -> list[str]:
    out = [f'<line x1="{left}" y1="{y}" x2="{left + plot}" y2="{y}" stroke="#888"/>']
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = left + plot * tick
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#888"/>'
                   f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{tick:g}</text>')
    return out


def sparkline_svg(runs: tuple[Run, ...], width: int = 220, height: int = 36) -> str:
    """Seconds of each build, oldest first; failed runs in red; hover for time and key."""
    if not runs:
        return '<span class="muted">–</span>'
    pad = 5
    top = max(r.seconds for r in runs) or 1.0
    step = (width - 2 * pad) / max(len(runs) - 1, 1)
    points = [(pad + i * step if len(runs) > 1 else width / 2,
               height - pad - (r.seconds / top) * (height - 2 * pad)) for i, r in enumerate(runs)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    out = [_svg_open(width, height, "seconds per build"),
           f'<polyline points="{line}" fill="none" stroke="{SERIES[0]}" stroke-width="1.5"/>']
    for (x, y), r in zip(points, runs, strict=True):
        colour = FAILED if r.outcome == "failed" else SERIES[0]
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"><title>'
                   f"{escape(r.time)}: {r.seconds:.2f} s, {escape(r.outcome)}, key "
                   f"{escape((r.key or '–')[:KEY_SHOWN])}</title></circle>")
    return "".join(out) + "</svg>"


def agreement_svg(points: tuple[AgreementPoint, ...], width: int = 720,
                  height: int = 170) -> str:
    """Mean agreement (and mean teacher-forced agreement) of each checked result over time;
    a result of the test double is a hollow square, a failed one is red."""
    left, right, top, bottom = 44, 20, 22, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / max(len(points) - 1, 1)
    xs = [left + i * step if len(points) > 1 else left + plot_w / 2 for i in range(len(points))]
    out = [_svg_open(width, height, "agreement over time")]
    for tick in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - tick)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                   f'stroke="#ddd"/><text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f"{tick:g}</text>")
    names = ("mean teacher-forced agreement", "mean agreement (free-running or device)")
    for j, attr in enumerate(("mean_teacher_forced", "mean_agreement")):
        values = [getattr(p, attr) for p in points]
        if all(v is None for v in values):
            continue
        out.append(f'<rect x="{left + j * 230}" y="4" width="12" height="12" '
                   f'fill="{SERIES[j]}"/><text x="{left + j * 230 + 16}" y="14">{names[j]}</text>')
        out += _series_marks(points, xs, values, top, plot_h, SERIES[j], 5 - 2 * j)
    anchor = "middle" if len(points) == 1 else "start"
    out.append(f'<text x="{xs[0]:.1f}" y="{height - 8}" text-anchor="{anchor}">'
               f"{escape(points[0].time)}</text>")
    if len(points) > 1:
        out.append(f'<text x="{xs[-1]:.1f}" y="{height - 8}" text-anchor="end">'
                   f"{escape(points[-1].time)}</text>")
    return "".join(out) + "</svg>"


def _series_marks(points: tuple[AgreementPoint, ...], xs: list[float],
                  values: list[float | None], top: int, plot_h: int, colour: str,
                  size: int) -> list[str]:
    """One series; `size` shrinks for the later series, so equal values stay visible."""
    placed = [(x, top + plot_h * (1 - _clip(v)), p, v)
              for x, p, v in zip(xs, points, values, strict=True) if v is not None]
    out = [f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in placed)}" '
           f'fill="none" stroke="{colour}" stroke-width="1.5"/>']
    for x, y, p, v in placed:
        edge = FAILED if p.passed is False else colour
        tip = (f"<title>{escape(p.time)} {escape(p.check)} {v:.3f} key "
               f"{escape(p.key[:KEY_SHOWN])}{' (TEST DOUBLE)' if p.fake else ''}</title>")
        if p.fake:
            out.append(f'<rect x="{x - size:.1f}" y="{y - size:.1f}" width="{2 * size}" '
                       f'height="{2 * size}" fill="#fff" stroke="{edge}" stroke-width="2">'
                       f"{tip}</rect>")
        else:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size}" fill="{colour}" '
                       f'stroke="{edge}" stroke-width="2">{tip}</circle>')
    return out


def _svg_open(width: int, height: int, label: str) -> str:
    # No xmlns: inline SVG in HTML needs none, and the page names no URL at all.
    return (f'<svg width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">')


# -- formatting ----------------------------------------------------------------------


def _href(rel: str) -> str:
    """A project-relative path under build/, as seen from build/report/index.html."""
    inside = rel[len("build/"):] if rel.startswith("build/") else f"../{rel}"
    return escape(f"../{inside}")


def _capital(phrase: str) -> str:
    """A declared noun phrase ("the ... TEST DOUBLE") at the start of a sentence."""
    return phrase[:1].upper() + phrase[1:]


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _clip(value: float) -> float:
    return min(max(value, 0.0), 1.0)


def _secs(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _ratio(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
