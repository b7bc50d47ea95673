"""The watchdog's view of a running stage: output silence, CPU and memory, phase, heartbeats.

Executors feed it samples (CPU seconds and resident bytes of the stage's process tree or
container) and it decides when a heartbeat is due and what it says. Pure: no clocks or
processes of its own, so it is tested with plain numbers.

- Cores busy are measured over a window, never between two close samples: since the
  previous heartbeat and at least the last `WINDOW_S` (from the start in a younger stage).
  A single-threaded compile on a loaded machine can get little CPU for a moment; over a
  window it still shows. A silent stage is `idle` only if, over the part of that window
  since its last output, it used less than `IDLE_CORES`.
- With the usual length from earlier builds (`Watch.usual_s`), the elapsed time reads
  `1 h 10 of about 3 h 30 (median of 2 earlier builds)`; a stage past `OVERDUE_RATIO`
  times the usual and `OVERDUE_S` more is called out: `running 2.1× longer than usual`.
- Every new log line is matched against the target's phase table (`phases.py`, declared
  in its `[watch]`); the beat names the
  latest phase and how long it has lasted: `phase: placement of m__tbt (since 42 min)`.
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..declare.phases import Phase, next_phase
from .base import Watch

MIB = 1024 * 1024
OWN_PREFIX = "[hefbuild] heartbeat: "
WINDOW_S = 5.0
IDLE_CORES = 0.1
OVERDUE_RATIO = 1.5
OVERDUE_S = 300.0
READ_LIMIT = 1 << 20  # a larger burst of output is read from its end
PARTIAL_LIMIT = 4096  # of a line not ended yet (a progress bar ends its updates with \r)
MATCH_LIMIT = 256  # lines per read matched against the phase table (a burst: its end)
LINE_END = re.compile(rb"[\r\n]")


@dataclass
class StageWatch:
    watch: Watch
    log_path: Path
    started: float
    last_beat: float = 0.0
    log_size: int = 0
    last_output_at: float = 0.0
    last_line: str = ""
    peak_rss: int = 0
    cpu_seconds: float = 0.0
    phase: Phase | None = None
    phase_since: float = 0.0
    _samples: deque[tuple[float, float]] = field(default_factory=deque, repr=False)
    _partial: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        self.last_beat = self.last_output_at = self.started

    def sample(self, now: float, cpu_seconds: float, rss_bytes: int) -> dict[str, Any] | None:
        """Take one sample; returns a heartbeat when one is due."""
        self._read_log(now)
        self.peak_rss = max(self.peak_rss, rss_bytes)
        # A tree that could not be read reports 0: the CPU used so far never goes down.
        self.cpu_seconds = max(self.cpu_seconds, cpu_seconds)
        self._keep_sample(now)
        if now - self.last_beat < self.watch.interval_s:
            return None
        beat = self._beat(now, rss_bytes)
        self.last_beat = now
        self._log_beat(beat)
        return beat

    def _log_beat(self, beat: dict[str, Any]) -> None:
        """Heartbeats go into the stage log too; `_read_log` skips them (not the stage's
        output), so the log position is left alone and nothing the rule wrote is missed."""
        with open(self.log_path, "ab") as log:
            log.write(f"{OWN_PREFIX}{beat['message']}\n".encode())

    # -- CPU over a window -----------------------------------------------------------

    def _window_start(self, now: float) -> float:
        return min(now - WINDOW_S, self.last_beat)

    def _keep_sample(self, now: float) -> None:
        """Samples back to the last one at or before the window's start (the window only
        moves forward, so older ones are never needed again)."""
        self._samples.append((now, self.cpu_seconds))
        start = self._window_start(now)
        while len(self._samples) > 1 and self._samples[1][0] <= start:
            self._samples.popleft()

    def _cores_since(self, since: float, now: float) -> float:
        ref_time, ref_cpu = self.started, 0.0
        for at, cpu in self._samples:
            if at > since:
                break
            ref_time, ref_cpu = at, cpu
        return (self.cpu_seconds - ref_cpu) / max(now - ref_time, 1e-6)

    # -- the beat ----------------------------------------------------------------------

    def _beat(self, now: float, rss: int) -> dict[str, Any]:
        start = self._window_start(now)
        beat: dict[str, Any] = {
            "elapsed_s": round(now - self.started, 1),
            "cpu_cores": round(self._cores_since(start, now), 2),
            "rss_mb": round(rss / MIB, 1),
            "silent_s": round(now - self.last_output_at, 1),
            "last_line": self.last_line[:200],
        }
        if self.watch.usual_s is not None:
            beat.update(usual_s=round(self.watch.usual_s, 1),
                        usual_builds=self.watch.usual_builds)
        if self.phase is not None:
            beat.update(phase=self.phase.text, phase_s=round(now - self.phase_since, 1))
        quiet = self._cores_since(max(start, self.last_output_at), now)
        beat["message"] = message(beat, self.watch.silence_s, quiet)
        return beat

    # -- the log -----------------------------------------------------------------------

    def _read_log(self, now: float) -> None:
        data = self._new_bytes()
        if not data:
            return
        *complete, self._partial = LINE_END.split(self._partial + data)
        self._partial = self._partial[-PARTIAL_LIMIT:]
        lines = [_own_removed(raw) for raw in complete]
        for line in lines[-MATCH_LIMIT:]:  # the latest phase is what a beat names
            if line:
                self._see(line, now)
        shown = [ln for ln in [*lines, _own_removed(self._partial)] if ln]
        if shown:
            self.last_output_at, self.last_line = now, shown[-1]

    def _new_bytes(self) -> bytes:
        try:
            size = os.path.getsize(self.log_path)
        except OSError:
            return b""
        if size <= self.log_size:
            return b""
        start = max(self.log_size, size - READ_LIMIT)
        if start > self.log_size:
            self._partial = b""  # its end was skipped
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                data = f.read(size - start)
        except OSError:
            return b""
        self.log_size = start + len(data)
        return data

    def _see(self, line: str, now: float) -> None:
        """A new line of the stage's output: the phase it announces, if any."""
        phase = next_phase(self.watch.phases, self.phase, line)
        if phase is None or phase == self.phase:
            return
        if self.phase is None or phase.name != self.phase.name:
            self.phase_since = now  # a new step of the same phase keeps its clock
        self.phase = phase


def _own_removed(raw: bytes) -> str:
    """A log line without a heartbeat of ours (which may even have landed mid-line)."""
    return raw.decode(errors="replace").split(OWN_PREFIX, 1)[0].strip()


# -- the message: pure, from the beat's numbers --------------------------------------------

def message(beat: dict[str, Any], silence_s: float, quiet_cores: float) -> str:
    """What a person reads: the alerts first (silence, overrun), then the details, then
    the stage's last output line (last, whole up to 120 characters: its end says most)."""
    elapsed, usual = beat["elapsed_s"], beat.get("usual_s")
    details = (f"{_progress(elapsed, usual, beat.get('usual_builds', 0))}, "
               f"{beat['cpu_cores']:.1f} cores, {beat['rss_mb']:.0f} MiB, "
               f"last output {_duration(beat['silent_s'])} ago")
    if beat.get("phase"):
        details += f"; phase: {beat['phase']} (since {_duration(beat['phase_s'])})"
    alerts = []
    if beat["silent_s"] >= silence_s:
        alerts.append(f"no output for {_duration(beat['silent_s'])}, {_busy(quiet_cores)}")
    if overdue(elapsed, usual):
        alerts.append(f"running {elapsed / usual:.1f}× longer than usual")
    text = f"{', '.join(alerts)} ({details})" if alerts else details
    if beat["last_line"]:
        text += f": {beat['last_line'][:120]}"
    return text


def overdue(elapsed: float, usual: float | None) -> bool:
    """Well past the usual length: both by a ratio and by minutes (a 10 s stage that
    takes 20 s is noise, a 4 h compile at 6 h is not)."""
    return (usual is not None and elapsed > OVERDUE_RATIO * usual
            and elapsed - usual > OVERDUE_S)


def _progress(elapsed: float, usual: float | None, builds: int) -> str:
    if usual is None:
        return f"{_duration(elapsed)} elapsed"
    basis = f"median of {builds} earlier builds" if builds > 1 else "1 earlier build"
    return f"{_duration(elapsed)} of about {_duration(usual)} ({basis})"


def _busy(cores: float) -> str:
    if cores < IDLE_CORES:
        return "idle"
    # The figure, not a rounded count: "1 core busy" beside "0.4 cores" read as a contradiction.
    return f"busy ({cores:.1f} cores since its last output)"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d}"
