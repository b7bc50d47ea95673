"""The end-of-run line: what every task of this invocation came to.

    hefbuild: 2 built, 1 restored, 3 from remote (1.8 MB in 0.4 s), 4 up to date, 0 failed
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .events import Outcome

_LABELS = {Outcome.BUILT: "built", Outcome.RESTORED: "restored", Outcome.REMOTE: "from remote",
           Outcome.UPTODATE: "up to date", Outcome.FAILED: "failed"}


def events_since(path: Path, offset: int) -> list[dict[str, Any]]:
    """The outcome lines appended to the event log after `offset` bytes (torn lines skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return []
    found = []
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "outcome" in event:
            found.append(event)
    return found


def summary_line(events: list[dict[str, Any]]) -> str:
    last = {e["task"]: e for e in events}  # a task's final word in this run
    counts = {o: 0 for o in _LABELS}
    remote_bytes, remote_s = 0, 0.0
    for event in last.values():
        try:
            outcome = Outcome(event["outcome"])
        except ValueError:
            continue
        counts[outcome] += 1
        if outcome is Outcome.REMOTE:
            remote_bytes += int(event.get("bytes", 0))
            remote_s += float(event.get("remote_seconds", event.get("seconds", 0.0)))
    parts = []
    for outcome, label in _LABELS.items():
        text = f"{counts[outcome]} {label}"
        if outcome is Outcome.REMOTE and counts[outcome]:
            text += f" ({human_bytes(remote_bytes)} in {remote_s:.1f} s)"
        parts.append(text)
    return "hefbuild: " + ", ".join(parts)


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
