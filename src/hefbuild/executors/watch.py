"""The watchdog's view of a running stage: output silence, CPU and memory, heartbeats.

Executors feed it samples (CPU seconds and resident bytes of the stage's process tree or
container) and it decides when a heartbeat is due and what it says. Pure: no clocks or
processes of its own, so it is tested with plain numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import Watch

MIB = 1024 * 1024
OWN_PREFIX = "[hefbuild] heartbeat: "


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
    _prev: tuple[float, float] | None = field(default=None, repr=False)  # (time, cpu)

    def __post_init__(self) -> None:
        self.last_beat = self.last_output_at = self.started

    def sample(self, now: float, cpu_seconds: float, rss_bytes: int) -> dict[str, Any] | None:
        """Take one sample; returns a heartbeat when one is due."""
        self._read_log(now)
        self.peak_rss = max(self.peak_rss, rss_bytes)
        self.cpu_seconds = max(self.cpu_seconds, cpu_seconds)
        if now - self.last_beat < self.watch.interval_s:
            return None
        cores = self._cores_busy(now, cpu_seconds)
        self.last_beat = now
        beat = self._beat(now, cores, rss_bytes)
        self._log_beat(beat)
        return beat

    def _log_beat(self, beat: dict[str, Any]) -> None:
        """Heartbeats go into the stage log too, without counting as the stage's output."""
        with open(self.log_path, "ab") as log:
            log.write(f"{OWN_PREFIX}{beat['message']}\n".encode())
        self.log_size = os.path.getsize(self.log_path)

    def _cores_busy(self, now: float, cpu: float) -> float:
        prev, self._prev = self._prev, (now, cpu)
        if prev is None:
            return cpu / max(now - self.started, 1e-6)
        return (cpu - prev[1]) / max(now - prev[0], 1e-6)

    def _beat(self, now: float, cores: float, rss: int) -> dict[str, Any]:
        silent = now - self.last_output_at
        beat = {
            "elapsed_s": round(now - self.started, 1),
            "cpu_cores": round(cores, 2),
            "rss_mb": round(rss / MIB, 1),
            "silent_s": round(silent, 1),
            "last_line": self.last_line[:200],
        }
        beat["message"] = self._message(beat, silent)
        return beat

    def _message(self, beat: dict[str, Any], silent: float) -> str:
        text = (f"{_duration(beat['elapsed_s'])} elapsed, {beat['cpu_cores']:.1f} cores, "
                f"{beat['rss_mb']:.0f} MiB, last output {_duration(silent)} ago")
        if silent >= self.watch.silence_s:
            busy = max(1, round(beat["cpu_cores"])) if beat["cpu_cores"] >= 0.5 else 0
            state = f"{busy} core{'s' if busy != 1 else ''} busy" if busy else "idle"
            text = f"no output for {_duration(silent)}, {state} ({text})"
        if self.last_line:
            text += f": {self.last_line[:120]}"
        return text

    def _read_log(self, now: float) -> None:
        try:
            size = os.path.getsize(self.log_path)
        except OSError:
            return
        if size == self.log_size:
            return
        self.last_output_at, self.log_size = now, size
        with open(self.log_path, "rb") as f:
            f.seek(max(0, size - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith(OWN_PREFIX)]
        if lines:
            self.last_line = lines[-1]


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
