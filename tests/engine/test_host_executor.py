"""HostExecutor with real (short) child processes."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from hefbuild.executors import ExecRequest, HostExecutor


def request(tmp_path: Path, argv: list[str], timeout_s: float | None = None) -> ExecRequest:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "STAGE_VAR": "from-toolchain"}
    return ExecRequest(argv, tmp_path, env, tmp_path / "log.txt", timeout_s=timeout_s)


def gone(pid: int, within_s: float = 2.0) -> bool:
    """The process no longer runs (a zombie waiting for an absent reaper counts as gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def test_stdout_and_stderr_go_to_the_log_in_order(tmp_path):
    script = "echo out; echo err >&2; echo $STAGE_VAR; pwd; exit 3"
    result = HostExecutor().run(request(tmp_path, ["sh", "-c", script]))
    assert result.returncode == 3
    assert not result.timed_out
    log = (tmp_path / "log.txt").read_text().splitlines()
    assert log == ["out", "err", "from-toolchain", str(tmp_path)]


def test_peak_rss_is_the_child_s(tmp_path):
    argv = [sys.executable, "-c", "x = b'x' * (64 << 20)"]
    result = HostExecutor().run(request(tmp_path, argv))
    assert result.returncode == 0
    assert 60 < result.peak_rss_mb < 1024


def test_timeout_kills_the_child(tmp_path):
    start = time.monotonic()
    result = HostExecutor().run(request(tmp_path, ["sleep", "30"], timeout_s=0.5))
    assert result.timed_out
    assert result.returncode == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - start < 5


def test_timeout_kills_grandchildren(tmp_path):
    script = "sleep 30 & echo $! > grandchild.pid; wait"
    result = HostExecutor().run(request(tmp_path, ["sh", "-c", script], timeout_s=0.5))
    assert result.timed_out
    assert gone(int((tmp_path / "grandchild.pid").read_text()))


def test_grandchild_left_behind_by_a_finished_rule_is_killed(tmp_path):
    script = "sleep 30 & echo $! > grandchild.pid"
    result = HostExecutor().run(request(tmp_path, ["sh", "-c", script]))
    assert result.returncode == 0
    assert gone(int((tmp_path / "grandchild.pid").read_text()))


def test_interrupt_while_waiting_kills_the_process_group(tmp_path):
    script = "sleep 30 & echo $! > grandchild.pid; wait"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            HostExecutor().run(request(tmp_path, ["sh", "-c", script]))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert gone(int((tmp_path / "grandchild.pid").read_text()))
