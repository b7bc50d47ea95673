"""The end-of-run line: what every task of this invocation came to.

    hefbuild: 2 built, 1 restored, 3 from remote (1.8 MB in 0.4 s), 4 up to date, 0 failed in 9.12 s

then, when stages ran on a cluster, which node built which: `; ran on gpu-1 (optimize:m)`,
and in a parallel run (`doit -n N`) the chain of tasks that set its end (`critical`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..store.events import Outcome, read_events

_LABELS = {Outcome.BUILT: "built", Outcome.RESTORED: "restored", Outcome.REMOTE: "from remote",
           Outcome.UPTODATE: "up to date", Outcome.FAILED: "failed"}


def ran(line: dict[str, Any]) -> bool:
    """A line of something that ran: a task's outcome, or an environment made ready (what
    build/trace.json draws: report/trace.py)."""
    return "outcome" in line or "env" in line


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
            counts["left_remote"] = counts.get("left_remote", 0) + bool(event.get("in_remote"))
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


def summary_line(counts: dict[str, Any], wall: float | None = None, critical: str = "") -> str:
    """The counts, then the invocation's wall time and (parallel runs) its critical path."""
    parts = []
    for outcome, label in _LABELS.items():
        text = f"{counts.get(outcome.value, 0)} {label}"
        if outcome is Outcome.REMOTE and counts.get(outcome.value):
            left = counts.get("left_remote", 0)
            text += f" ({human_bytes(counts['remote_bytes'])} in " \
                    f"{counts['remote_seconds']:.1f} s" + \
                    (f"; {left} left in the remote cache)" if left else ")")
        parts.append(text)
    line = "hefbuild: " + ", ".join(parts)
    if wall is not None:
        line += f" in {human_seconds(wall)}"
    nodes = counts.get("nodes") or {}
    if nodes:
        line += "; ran on " + ", ".join(f"{n} ({', '.join(t)})" for n, t in nodes.items())
    return f"{line}; {critical}" if critical else line


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_seconds(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
