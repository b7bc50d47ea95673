"""The one interface every executor implements: `run(request) -> result`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class ExecRequest:
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    log_path: Path  # stdout and stderr, interleaved, go here
    timeout_s: float | None = None
    mounts: dict[str, Path] = field(default_factory=dict)  # for sandboxing executors


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    seconds: float
    peak_rss_mb: float
    timed_out: bool = False


class Executor(Protocol):
    def run(self, request: ExecRequest) -> ExecResult: ...
