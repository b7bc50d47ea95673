"""The report's charts as inline SVG (no script, no network): bars of per-prompt figures
with their gate, a sparkline of a stage's build times, and a check's agreement over time.
Every label is escaped."""

from __future__ import annotations

from html import escape

from .model import KEY_SHOWN, AgreementPoint, Run

SERIES = ("#1f5fa8", "#e0791a")  # teacher-forced, then free-running (or device) agreement
FAILED = "#c62828"


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


def _clip(value: float) -> float:
    return min(max(value, 0.0), 1.0)


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
