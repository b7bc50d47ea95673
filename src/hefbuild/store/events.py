"""What happened, for people and tools: `build/events.jsonl` and per-stage manifests."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import time
from enum import Enum
from pathlib import Path
from typing import Any


class Outcome(str, Enum):
    BUILT = "built"
    RESTORED = "restored"
    REMOTE = "remote"  # fetched from the remote cache, verified, now in the local store
    UPTODATE = "uptodate"
    FAILED = "failed"


class EventLog:
    """One JSON line per task per invocation, appended whole (see `_write`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def heartbeat(self, task: str, key: str, beat: dict[str, Any]) -> None:
        """A line for a running stage (it has no `outcome`: the task is not over)."""
        self._write({"task": task, "key": key, "heartbeat": beat, "time": _now(),
                     "unix": _unix()})

    def env(self, task: str, key: str, toolchain: str, seconds: float, **extra: Any) -> None:
        """A toolchain environment made ready for a task's stage (created, or waited for),
        or its `error`: a line of its own, since its time is not the stage's."""
        self._write({"env": toolchain, "task": task, "key": key, "seconds": round(seconds, 3),
                     "time": _now(), "unix": _unix(), **extra})

    def append(self, task: str, key: str | None, outcome: Outcome, seconds: float,
               peak_rss_mb: float, **extra: Any) -> None:
        self._write({
            "task": task, "key": key, "outcome": outcome.value,
            "seconds": round(seconds, 4), "peak_rss_mb": round(peak_rss_mb, 1),
            "time": _now(), "unix": _unix(), **extra,
        })

    def summary(self, counts: dict[str, Any], uptodate: list[str]) -> None:
        """The invocation's one closing line; up-to-date tasks are named here, not each
        on its own line, so a no-op of 1000 tasks adds one line."""
        self._write({"summary": counts, "uptodate": sorted(uptodate), "time": _now(),
                     "unix": _unix()})

    def _write(self, line: dict[str, Any]) -> None:
        """One whole line or nothing: under an exclusive lock, a broken tail (a write cut
        by a full disk or a kill) is first ended by a newline so nothing glues onto it,
        and a short write is cut back off. An event that cannot be written is dropped:
        the log reports a build, it never fails one."""
        data = (json.dumps(line, sort_keys=True) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            _append_whole(fd, data)
        except OSError:
            pass
        finally:
            os.close(fd)


def _append_whole(fd: int, data: bytes) -> None:
    end = os.lseek(fd, 0, os.SEEK_END)
    if end and os.pread(fd, 1, end - 1) != b"\n":
        data = b"\n" + data
    try:
        written = os.write(fd, data)
    except OSError:
        written = -1
    if written != len(data):
        os.ftruncate(fd, end)  # nothing rather than half a line


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The whole lines of the log after `offset`, and how many damaged lines were skipped."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], 0
    events, damaged = [], 0
    for raw in data.splitlines():
        try:
            event = json.loads(raw)
        except ValueError:
            damaged += 1
            continue
        if isinstance(event, dict):
            events.append(event)
        else:
            damaged += 1
    return events, damaged


ROTATE_BYTES = 8 << 20


def rotate(path: Path, max_bytes: int = ROTATE_BYTES, keep: int = 2) -> None:
    """Keep the event log bounded: past `max_bytes`, events.jsonl becomes events.1.jsonl
    (and .1 becomes .2 ...); called once per invocation, under the project lock."""
    try:
        if path.stat().st_size <= max_bytes:
            return
    except OSError:
        return
    for n in range(keep, 0, -1):
        older = path.with_name(f"{path.stem}.{n}{path.suffix}")
        newer = path if n == 1 else path.with_name(f"{path.stem}.{n - 1}{path.suffix}")
        if newer.exists():
            os.replace(newer, older)


def expand_summaries(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Task events with each summary's up-to-date tasks as one `uptodate` event each."""
    out: list[dict[str, Any]] = []
    for line in lines:
        if "summary" in line:
            out += [{"task": t, "outcome": Outcome.UPTODATE.value} for t in line["uptodate"]]
        elif "outcome" in line:
            out.append(line)
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _unix() -> float:
    """The moment of `time` to the microsecond: a task line's start is `unix - seconds`,
    which a trace needs (`time` alone is to the second and marks the end)."""
    return round(time.time(), 6)


def read_json(path: Path | str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def peak_rss_mb() -> float:
    """This process's peak resident memory (what a restore or a check cost)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
