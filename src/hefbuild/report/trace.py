"""`build/trace.json`: the last doit invocation that ran something, in the Chrome trace
event format.

Open it in https://ui.perfetto.dev or chrome://tracing. One complete event (`ph: "X"`)
per task that did something, on one lane (`tid`) per task running at the same time, so
`doit -n 2` shows its overlap; a venv toolchain's creation is a bar of its own (`cat:
"env"`) just before the stage it was made for; heartbeats become memory counters; the
up-to-date tasks are one instant at the end.

Written by the reporter at the end of every invocation, from the event log lines that
invocation appended, unless nothing ran (a no-op would only say so, and overwrite the
trace someone came to read). The last `KEEP` such traces are kept as
`build/traces/<UTC time>.json`; `build/trace.json` is the newest of them. It imports
nothing beyond the standard library, and a trace that cannot be written is skipped (it
reports a build, it never fails one).
"""

from __future__ import annotations

import calendar
import json
import os
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..store.events import read_events
from .summary import ran

TRACE = "trace.json"
TRACES = "traces"  # under build/: the last KEEP traces, by the UTC time they were written
KEEP = 5
PID = 1  # one invocation, one process in the trace (doit's workers are an implementation detail)
_ARGS = ("outcome", "key", "seconds", "peak_rss_mb", "bytes", "remote_seconds", "error", "env",
         "env_s", "created")


@dataclass(frozen=True)
class Span:
    task: str
    start: float  # Unix seconds
    seconds: float
    args: dict[str, Any]

    @property
    def end(self) -> float:
        return self.start + self.seconds


def span_of(line: dict[str, Any]) -> Span | None:
    """A task line (or a toolchain environment's) as a span; None for a line that cannot be
    placed in time."""
    if not ran(line) or "task" not in line:
        return None
    seconds = float(line.get("seconds") or 0.0)
    end = moment_of(line)
    if end is None:
        return None
    name = str(line["task"]) if "outcome" in line else \
        f"venv toolchain {line['env']} for {line['task']}"
    return Span(name, end - seconds, seconds, {k: line[k] for k in _ARGS if k in line})


def moment_of(line: dict[str, Any]) -> float | None:
    """When a line was written: `unix`, or (older logs) `time`, which is to the second."""
    if isinstance(line.get("unix"), (int, float)):
        return float(line["unix"])
    try:
        return float(calendar.timegm(time.strptime(str(line["time"]), "%Y-%m-%dT%H:%M:%SZ")))
    except (KeyError, ValueError):
        return None


def lanes(spans: list[Span]) -> list[int]:
    """A lane per span such that spans of one lane never overlap (first free lane wins, so
    a sequential chain stays on lane 0)."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i].start, -spans[i].seconds))
    ends: list[float] = []
    lane = [0] * len(spans)
    for i in order:
        free = next((n for n, end in enumerate(ends) if end <= spans[i].start), None)
        if free is None:
            free = len(ends)
            ends.append(0.0)
        ends[free] = spans[i].end
        lane[i] = free
    return lane


def trace_of(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace of one invocation's event log lines (task, heartbeat and summary lines)."""
    spans = [s for s in map(span_of, lines) if s is not None]
    summary = next((ln for ln in reversed(lines) if "summary" in ln), None)
    moments = [s.start for s in spans] + [m for m in map(moment_of, lines) if m is not None]
    origin = min(moments, default=0.0)
    events: list[dict[str, Any]] = [_meta("process_name", 0, "hefbuild (doit)")]
    tids = lanes(spans)
    events += [_meta("thread_name", n + 1, f"lane {n + 1}") for n in sorted(set(tids))]
    events += [_complete(s, tid + 1, origin) for s, tid in zip(spans, tids, strict=True)]
    events += [c for c in (_counter(ln, origin) for ln in lines) if c is not None]
    if summary is not None and summary.get("uptodate"):
        events.append(_uptodate(summary, origin))
    other = {"started": _iso(origin) if moments else None,
             "summary": (summary or {}).get("summary")}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _meta(name: str, tid: int, value: str) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": PID, "tid": tid, "args": {"name": value}}


def _complete(span: Span, tid: int, origin: float) -> dict[str, Any]:
    cat = str(span.args.get("outcome", "env" if "env" in span.args else ""))
    return {"name": span.task, "cat": cat, "ph": "X",
            "ts": _us(span.start - origin), "dur": _us(span.seconds), "pid": PID,
            "tid": tid, "args": span.args}


def _counter(line: dict[str, Any], origin: float) -> dict[str, Any] | None:
    """A heartbeat's memory and CPU, as a counter track of its task."""
    beat, at = line.get("heartbeat"), moment_of(line)
    if not isinstance(beat, dict) or at is None or "rss_mb" not in beat:
        return None
    values = {k: beat[k] for k in ("rss_mb", "cpu_cores") if k in beat}
    return {"name": f"{line.get('task')} memory", "ph": "C", "ts": _us(at - origin),
            "pid": PID, "args": values}


def _uptodate(summary: dict[str, Any], origin: float) -> dict[str, Any]:
    tasks = list(summary["uptodate"])
    return {"name": f"{len(tasks)} up to date", "ph": "i", "s": "p",
            "ts": _us((moment_of(summary) or origin) - origin), "pid": PID, "tid": 0,
            "args": {"tasks": tasks}}


def _iso(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def write_trace(events_path: Path, offset: int, keep: int = KEEP) -> Path | None:
    """Write the trace of the lines appended to `events_path` after `offset` into traces/
    next to it, and as trace.json, keeping the newest `keep`; the path of trace.json, or
    None when nothing ran (the last trace stays) or it could not be written."""
    lines, _damaged = read_events(events_path, offset)
    if not any(ran(line) for line in lines):
        return None
    data = json.dumps(trace_of(lines), separators=(",", ":"))
    build = events_path.parent
    try:
        (build / TRACES).mkdir(exist_ok=True)
        _write_whole(build / TRACES / f"{_stamp(time.time())}.json", data)
        _write_whole(build / TRACE, data)
    except OSError:
        return None
    _keep_newest(build / TRACES, keep)
    (build / "trace.1.json").unlink(missing_ok=True)  # where older versions kept one
    return build / TRACE


def _stamp(moment: float) -> str:
    """A name that sorts by time (to the microsecond: one project runs one doit at a time)."""
    micro = int(round(moment * 1_000_000)) % 1_000_000
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(moment))}.{micro:06d}Z"


def _write_whole(target: Path, data: str) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        tmp.write_text(data)
        os.replace(tmp, target)
    except OSError:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def _keep_newest(folder: Path, keep: int) -> None:
    for old in sorted(folder.glob("*.json"))[:-keep]:
        with suppress(OSError):
            old.unlink()
