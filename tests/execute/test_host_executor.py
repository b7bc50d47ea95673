"""HostExecutor with real (short) child processes."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from hefbuild.execute import ExecRequest, HostExecutor, StageRun, Watch


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


def _rule_stage(tmp_path: Path, source: str, beats: list) -> StageRun:

    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.py").write_text(source)
    for sub in ("out", "work"):
        (tmp_path / "scratch" / sub).mkdir(parents=True)
    return StageRun(task="quantize:m", interpreter=sys.executable, rules_dir=tmp_path / "rules",
                    rule="r.py", action={}, inputs={}, files={}, scratch=tmp_path / "scratch",
                    env={}, watch=Watch(interval_s=0.2, emit=beats.append), sandbox=False)


def test_a_rule_that_never_flushes_shows_its_progress_in_the_heartbeat(tmp_path):
    # A pipe makes Python block-buffer print(): without PYTHONUNBUFFERED the heartbeat
    # would only ever see the output at exit.
    beats: list = []
    stage = _rule_stage(tmp_path, "import time\nprint('calibrating 3/32')\ntime.sleep(1.5)\n",
                        beats)
    assert HostExecutor().run_stage(stage).returncode == 0
    assert any("calibrating 3/32" in str(b.get("last_line")) for b in beats), beats


def test_a_long_error_line_reaches_the_failure_message_whole(tmp_path):
    from hefbuild.execute.host import log_tail

    tail = "please unset the HF_HUB_OFFLINE environment variable"
    line = "OSError: " + "x" * 400 + " " + tail
    stage = _rule_stage(tmp_path, f"import sys\nprint('step')\nsys.exit({line!r})\n", [])
    assert HostExecutor().run_stage(stage).returncode == 1
    assert log_tail(stage.log_path) == line
    with open(stage.log_path, "a") as log:  # a heartbeat that landed after the error
        log.write("[hefbuild] heartbeat: 0 s elapsed, 0.2 cores, 10 MiB: OSError: xx\n")
    assert log_tail(stage.log_path) == line
