"""What executors share: the stage to run (`StageRun`), its limits, and the result.

An executor runs one rule inside its toolchain: `run_stage(stage) -> ExecResult`. The
engine describes the stage with host paths; each executor maps them to what the rule
sees (the same paths on the host, mount points in a container) and writes the rule's
action JSON accordingly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..declare.phases import PhaseTable
from ..plan.limits import Limits


@dataclass(frozen=True)
class Watch:
    """Heartbeats while a stage runs: every `interval_s`, and a silence warning after
    `silence_s` without an output line. `emit` receives each heartbeat as a dict."""

    interval_s: float = 60.0
    silence_s: float = 900.0
    emit: Callable[[dict[str, Any]], None] | None = None
    # How long comparable earlier builds took (their median), and how many there were:
    # the heartbeat gives an ETA and calls out a stage running far longer (store/history.py).
    usual_s: float | None = None
    usual_builds: int = 0
    # The stage's target's phase table (declare/targets.py): names the phase its log announces.
    phases: PhaseTable | None = None


@dataclass(frozen=True)
class StageRun:
    task: str
    interpreter: str  # the python that runs the rule (a path on the host, or in the image)
    rules_dir: Path
    rule: str  # path under rules_dir
    action: dict[str, Any]  # model, stage, target, params, source, outputs: no paths
    inputs: dict[str, Path]  # upstream stage -> its output folder (read-only)
    files: dict[str, Path]  # file parameter -> file (read-only)
    scratch: Path  # holds out/ (the only writable place), work/ and log.txt
    env: dict[str, str]
    limits: Limits = field(default_factory=Limits)
    watch: Watch = field(default_factory=Watch)
    image: str | None = None  # docker toolchains: the pinned image ID
    sandbox: bool = True  # host stages in bubblewrap (see execute/sandbox.py)
    network: bool = False  # fetch alone reaches the network (and gets the hub credentials)
    writable: tuple[Path, ...] = ()  # beyond out/ and work/ (fetch: the Hugging Face cache)
    log_file: Path | None = None  # where the rule's output streams (default scratch/log.txt)
    # The SHA-256 of every file the stage reads (inputs, file parameters, rule code), as the
    # key has them: a cluster moves them by digest without hashing them again.
    digests: dict[Path, str] = field(default_factory=dict)
    # The toolchain's name and the identity the key holds: a cluster node compares its own.
    toolchain: str = ""
    identity: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return self.scratch / "out"

    @property
    def work(self) -> Path:
        return self.scratch / "work"

    @property
    def log_path(self) -> Path:
        return self.log_file or self.scratch / "log.txt"

    def action_json(self, path_of: Callable[[Path], str]) -> str:
        """The rule's ACTION_JSON, with every path as the rule will see it."""
        return json.dumps({
            "format": 1, **self.action,
            "inputs": {k: path_of(v) for k, v in sorted(self.inputs.items())},
            "files": {k: path_of(v) for k, v in sorted(self.files.items())},
            "out": path_of(self.out),
        }, indent=1, sort_keys=True)


@dataclass(frozen=True)
class ExecRequest:
    """One process to run on the host (the host executor's own unit of work)."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    log_path: Path  # stdout and stderr, interleaved, go here
    timeout_s: float | None = None
    memory_bytes: int | None = None
    watch: Watch = field(default_factory=Watch)
    pass_fds: tuple[int, ...] = ()  # open fds the process inherits (bwrap's seccomp filter)


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    seconds: float
    peak_rss_mb: float
    timed_out: bool = False
    cpu_seconds: float = 0.0
    killed_for: str | None = None  # "timeout" or "memory" when a limit ended the stage
    isolation: str = "none"  # what kept the rule in: "bwrap", "docker" or "none"
    node: dict[str, Any] | None = None  # a cluster's node that ran it (name, id, address)


class Executor(Protocol):
    def run_stage(self, stage: StageRun) -> ExecResult: ...
