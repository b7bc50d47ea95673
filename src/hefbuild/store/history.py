"""How long a stage usually takes: earlier builds of the same stage, by the same rule code,
on inputs of about the same size. The heartbeat compares a running stage with it.

Where the history lives: `<store>/v1/durations.jsonl`, one JSON line per built stage, with
the fields of a `built` event of `build/events.jsonl` (task, key, outcome, seconds,
peak_rss_mb, time) plus `rule` (a short fingerprint of the rule code's digests) and
`input_bytes` (what the stage read). Why the store and not the project's event log:

- the store is shared by every project of the user, so a 4 h compile measured in one
  checkout gives the ETA in another (the size factor below keeps a tiny model from
  predicting a large one);
- `rm -rf build` is routine and would erase a project's history with its events;
- only built stages are written (a restore or a remote hit measures no build), so the
  file stays small: past `MAX_BYTES` it becomes `durations.1.jsonl` (one older generation
  is kept), and a read is at most twice that.

It is read only when a stage is about to build (never on `doit list` or a no-op), and
lost lines cost an ETA, never a build: a line that cannot be written is dropped, a line
that cannot be parsed is skipped.

`seconds` is the rule's own run time (what the heartbeat's elapsed time measures), not
the task's, which adds hashing and storing.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..digest import canonical_json, sha256_bytes
from .events import EventLog, Outcome, read_events, rotate

FILE = "durations.jsonl"
MAX_BYTES = 256 << 10
SIZE_FACTOR = 2.0  # comparable inputs are within 0.5x..2x of each other's size
RECENT = 9  # the median of at most the last 9 comparable builds: rules and machines drift


@dataclass(frozen=True)
class Usual:
    """The usual length of a stage: the median of `builds` earlier comparable builds."""

    seconds: float
    builds: int


def rule_fingerprint(rule_digests: dict[str, str]) -> str:
    """16 hex digits over the rule's code files and their digests (the key's `rule`)."""
    return sha256_bytes(canonical_json(rule_digests).encode()).hex[:16]


def similar_size(a: int, b: int, factor: float = SIZE_FACTOR) -> bool:
    if a <= 0 or b <= 0:
        return a == b  # a stage that reads nothing compares only with its like
    return max(a, b) <= factor * min(a, b)


def comparable(events: Iterable[dict[str, Any]], stage: str, rule: str,
               input_bytes: int) -> list[float]:
    """Durations of the earlier builds of `stage` by `rule` on inputs of a similar size,
    oldest first. Only `built` lines count: a restore took no build's time."""
    found = []
    for event in events:
        if (event.get("outcome") == Outcome.BUILT.value
                and str(event.get("task", "")).partition(":")[0] == stage
                and event.get("rule") == rule
                and isinstance(event.get("seconds"), (int, float))
                and isinstance(event.get("input_bytes"), int)
                and similar_size(event["input_bytes"], input_bytes)):
            found.append(float(event["seconds"]))
    return found


def usual(events: Iterable[dict[str, Any]], stage: str, rule: str,
          input_bytes: int) -> Usual | None:
    durations = comparable(events, stage, rule, input_bytes)[-RECENT:]
    if not durations:
        return None
    return Usual(statistics.median(durations), len(durations))


# -- the store's file --------------------------------------------------------------------

def read_durations(store_root: Path) -> list[dict[str, Any]]:
    """Every line of the store's history, the older generation first."""
    older, _ = read_events(store_root / FILE.replace(".jsonl", ".1.jsonl"))
    newer, _ = read_events(store_root / FILE)
    return older + newer


def record_duration(store_root: Path, task: str, key: str, seconds: float,
                    peak_rss_mb: float, rule: str, input_bytes: int) -> None:
    """Append one built stage (whole lines, under a lock: see `EventLog`). Rotating first
    keeps the file bounded; two writers rotating at once can at worst lose older lines."""
    path = store_root / FILE
    with suppress(OSError):  # a racing writer rotated it first
        rotate(path, MAX_BYTES, keep=1)
    EventLog(path).append(task, key, Outcome.BUILT, seconds, peak_rss_mb,
                          rule=rule, input_bytes=input_bytes)
