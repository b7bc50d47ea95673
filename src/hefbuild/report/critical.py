"""The critical path of a parallel run: the chain of tasks that set its end.

From this run's event lines (each task's end, `unix`, and its `seconds`) and each task's
upstream tasks: start at the task that ended last, step to the upstream task it waited
for (the one that ended last among those that ran), and so on. Tasks with no event (up to
date, groups) took no time; the chain looks through them to the tasks they wait on.
Pure: the reporter hands in the events and the dependencies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .summary import human_seconds


def critical_path(events: Sequence[dict[str, Any]],
                  deps: Mapping[str, Sequence[str]]) -> list[tuple[str, float]]:
    """(task, seconds) in run order, ending at the task that ended last; [] without events."""
    ends = {e["task"]: (float(e.get("unix", 0.0)), float(e.get("seconds", 0.0)))
            for e in events if "task" in e and "outcome" in e}
    if not ends:
        return []
    task = max(ends, key=lambda t: ends[t][0])
    chain = [task]
    while True:
        waited = _timed_upstream(task, ends, deps, set())
        if not waited:
            break
        task = max(waited, key=lambda t: ends[t][0])
        chain.append(task)
    return [(t, ends[t][1]) for t in reversed(chain)]


def _timed_upstream(task: str, ends: Mapping[str, Any], deps: Mapping[str, Sequence[str]],
                    seen: set[str]) -> set[str]:
    """The nearest upstream tasks of `task` that have an event, through those without."""
    found: set[str] = set()
    for up in deps.get(task, ()):
        if up in seen:
            continue
        seen.add(up)
        found |= {up} if up in ends else _timed_upstream(up, ends, deps, seen)
    return found


def path_text(chain: Sequence[tuple[str, float]]) -> str:
    """`critical path: fetch:m 1.20 s → export:m 14 s` (empty for no chain)."""
    if not chain:
        return ""
    return "critical path: " + " → ".join(f"{t} {human_seconds(s)}" for t, s in chain)
