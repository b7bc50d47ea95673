"""The end-of-run line: what every task of this invocation came to.

    hefbuild: 2 built, 1 restored, 3 from remote (1.8 MB in 0.4 s), 4 up to date, 0 failed

and, when stages ran on a cluster, which node built which: `; ran on gpu-1 (optimize:m)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..declare.checks import Checks, builtin_checks
from ..store.events import Outcome, read_events, read_json

_LABELS = {Outcome.BUILT: "built", Outcome.RESTORED: "restored", Outcome.REMOTE: "from remote",
           Outcome.UPTODATE: "up to date", Outcome.FAILED: "failed"}


def events_since(path: Path, offset: int) -> list[dict[str, Any]]:
    """The task lines appended to the event log after `offset` bytes (damaged ones skipped)."""
    events, _damaged = read_events(path, offset)
    return [e for e in events if "outcome" in e]


def outcome_counts(events: list[dict[str, Any]], uptodate: list[str]) -> dict[str, Any]:
    """Tasks per outcome in this run (a task's last event wins), and what came from remote."""
    last = {e["task"]: e for e in events if "task" in e}
    counts: dict[str, Any] = {o.value: 0 for o in _LABELS}
    counts["uptodate"] = len(set(uptodate) - set(last))
    counts["remote_bytes"], counts["remote_seconds"] = 0, 0.0
    for event in last.values():
        outcome = event.get("outcome")
        if outcome not in counts:
            continue
        counts[outcome] += 1
        if outcome == Outcome.REMOTE.value:
            counts["remote_bytes"] += int(event.get("bytes", 0))
            counts["remote_seconds"] += float(event.get("remote_seconds", 0.0))
    counts["remote_seconds"] = round(counts["remote_seconds"], 3)
    nodes = nodes_of(last.values())
    if nodes:
        counts["nodes"] = nodes
    return counts


def nodes_of(events: Any) -> dict[str, list[str]]:
    """Cluster node -> the tasks it built in this run (empty when everything ran here)."""
    nodes: dict[str, list[str]] = {}
    for event in events:
        if event.get("node") and event.get("outcome") == Outcome.BUILT.value:
            nodes.setdefault(event["node"], []).append(event["task"])
    return {n: sorted(tasks) for n, tasks in sorted(nodes.items())}


def summary_line(counts: dict[str, Any]) -> str:
    parts = []
    for outcome, label in _LABELS.items():
        text = f"{counts.get(outcome.value, 0)} {label}"
        if outcome is Outcome.REMOTE and counts.get(outcome.value):
            text += f" ({human_bytes(counts['remote_bytes'])} in " \
                    f"{counts['remote_seconds']:.1f} s)"
        parts.append(text)
    line = "hefbuild: " + ", ".join(parts)
    nodes = counts.get("nodes") or {}
    if nodes:
        line += "; ran on " + ", ".join(f"{n} ({', '.join(t)})" for n, t in nodes.items())
    return line


def check_verdict(root: Path, task: str, failed: bool = False,
                  checks: Checks | None = None) -> str:
    """A check task's one-line result with the figures it was gated on, from its report
    (`failed`: the report a failed run left in build/<model>/<stage>.failed/); '' when
    none. `checks`: the project's (else those of hefbuild's own targets)."""
    checks = checks or builtin_checks()
    stage = checks.stage_of(task)
    if stage is None:
        return ""
    model = task.split(":", 1)[1]
    rel = f"build/{model}/{stage}{'.failed' if failed else ''}/{checks.report_of(stage)}"
    report = read_json(root / rel)
    if report is None:
        return ""
    verdict = "passed" if report.get("passed") else "FAILED"
    if (report.get("device") or {}).get("fake"):
        verdict += f" on {checks.double(stage)} (not a device)"
    return f"{task}: {verdict}, {_gated_figures(report)}; {rel}"


def check_figures(root: Path, task: str, checks: Checks | None = None) -> dict[str, Any]:
    """A check result's headline figures, for its event (the report's history)."""
    checks = checks or builtin_checks()
    stage = checks.stage_of(task)
    if stage is None:
        return {}
    report = read_json(root / "build" / task.split(":", 1)[1] / stage / checks.report_of(stage))
    if report is None:
        return {}
    keys = ("passed", "mean_agreement", "mean_teacher_forced_agreement", "mean_logit_cosine")
    figures = {k: report[k] for k in keys if k in report}
    if (report.get("device") or {}).get("fake"):
        figures["fake"] = True
    return figures


def _gated_figures(report: dict[str, Any]) -> str:
    prompts = len(report.get("prompts", []))
    if report.get("gate") == "teacher_forced":
        return (f"teacher-forced agreement {report.get('mean_teacher_forced_agreement', 0):.3f}"
                f" (minimum {report.get('min_teacher_forced')}), logit cosine "
                f"{report.get('mean_logit_cosine', 0):.4f} (minimum "
                f"{report.get('min_logit_cosine')}) over {prompts} prompts; free-running "
                f"agreement {report.get('mean_agreement', 0):.2f}")
    text = (f"mean token agreement {report.get('mean_agreement', 0):.2f} over {prompts} "
            f"prompts (minimum {report.get('min_token_agreement')})")
    cosine = (report.get("prefill") or {}).get("cosine")
    if cosine is not None:
        text += f", prefill cosine {cosine:.4f} (minimum {report.get('prefill_cosine_min')})"
    return text


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
