"""The build report as one self-contained HTML page: inline CSS and SVG, no script, no
network. Every text that comes from a build (prompts, generated text, errors) is escaped.

Links point at files of build/ relative to `build/report/index.html`, so the page works
from the folder it is in, copied as a CI artifact together with build/.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from .model import (
    KEY_SHOWN,
    PLOTTED,
    BuildReport,
    Check,
    CheckKind,
    ModelReport,
    PromptFigures,
    Stage,
    StageHistory,
    StageState,
)
from .summary import summary_line
from .svg import agreement_svg, bars_svg, sparkline_svg
from .variants_html import CSS as SWEEP_CSS
from .variants_html import sweeps_html

COLOURS = {StageState.BUILT: "#2e7d32", StageState.RESTORED: "#1565c0",
           StageState.REMOTE: "#6a1b9a", StageState.FAILED: "#c62828",
           StageState.RUNNING: "#ef6c00", StageState.MISSING: "#9e9e9e"}
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
nav{display:flex;flex-wrap:wrap;gap:6px 22px;margin:4px 0}
nav .nav-model{display:inline-flex;align-items:center;gap:6px;white-space:nowrap}
section.unbuilt{background:#fff;border:1px solid #d8dbe0;border-radius:8px;margin:16px auto}
section.unbuilt li{margin:2px 0}
"""


def render(report: BuildReport) -> str:
    """The whole page."""
    title = f"hefbuild report: {report.project}" if report.project else "hefbuild report"
    body = [_header(report, title), sweeps_html(report.sweeps)] + \
        [_model(m) for m in report.models] + [_unbuilt(report), _footer(report)]
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>{CSS}{SWEEP_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _header(report: BuildReport, title: str) -> str:
    last = report.last_summary
    line = (f"last invocation ({escape(str(last.get('time', '')))}): "
            f"{escape(summary_line(last.get('summary') or {}))}" if last else "no invocation yet")
    # Each name and its badge in one box, the boxes apart: a badge reads as its own model's.
    nav = "".join(f'<span class="nav-model" data-model="{escape(m.name)}">'
                  f'<a href="#model-{escape(m.name)}">{escape(m.name)}</a>{_badge(m)}</span>'
                  for m in report.models)
    return (f"<header><h1>{escape(title)}</h1>"
            f'<p class="muted">made {escape(report.made)}; {line}</p><nav>{nav}</nav></header>')


def _unbuilt(report: BuildReport) -> str:
    """The models with nothing in build/, each with why."""
    if not report.unbuilt:
        return ""
    items = "".join(f'<li data-model="{escape(u.name)}"><b>{escape(u.name)}</b>: '
                    f"{escape('; '.join(u.why))}</li>" for u in report.unbuilt)
    return f'<section class="unbuilt"><h2>Not built</h2><ul>{items}</ul></section>'


def _footer(report: BuildReport) -> str:
    parts = []
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
    if s.env_s:  # kept out of its seconds: the environment is not the stage's work
        note += (f"its build first got venv toolchain {escape(s.env or '')} ready: "
                 f"{_secs(s.env_s)} s")
    if s.in_remote:
        note += (f"in the remote cache, not in build/: {escape(', '.join(s.in_remote))} "
                 f"(<code>doit fetch</code> brings them)")
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


def _href(rel: str) -> str:
    """A project-relative path under build/, as seen from build/report/index.html."""
    inside = rel[len("build/"):] if rel.startswith("build/") else f"../{rel}"
    return escape(f"../{inside}")


def _capital(phrase: str) -> str:
    """A declared noun phrase ("the ... TEST DOUBLE") at the start of a sentence."""
    return phrase[:1].upper() + phrase[1:]


def _secs(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _ratio(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
