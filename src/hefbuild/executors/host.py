"""Run a rule as a child process of this one, in its own process group."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from contextlib import suppress

from .base import ExecRequest, ExecResult

_POLL_S = 0.02
_PR_SET_PDEATHSIG = 1


class HostExecutor:
    def run(self, request: ExecRequest) -> ExecResult:
        start = time.monotonic()
        with open(request.log_path, "ab") as log:
            proc = subprocess.Popen(
                request.argv, cwd=request.cwd, env=request.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            try:
                status, rusage, timed_out = _wait(proc, start, request.timeout_s)
            except BaseException:
                # Ctrl-C or a crash of ours: take the whole stage down with us.
                _kill_group(proc.pid)
                with suppress(ChildProcessError):
                    os.wait4(proc.pid, 0)
                raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        return ExecResult(
            returncode=proc.returncode,
            seconds=time.monotonic() - start,
            peak_rss_mb=rusage.ru_maxrss / 1024.0,  # Linux reports KiB
            timed_out=timed_out,
        )


def _wait(proc: subprocess.Popen, start: float, timeout_s: float | None):
    """Reap the child with wait4, which gives its own peak RSS (not our other children's)."""
    timed_out = False
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            _kill_group(proc.pid)  # grandchildren left behind must not outlive the stage
            return status, rusage, timed_out
        if timeout_s is not None and time.monotonic() - start > timeout_s and not timed_out:
            timed_out = True
            _kill_group(proc.pid)
        time.sleep(_POLL_S)


def _die_with_parent() -> None:
    """Linux: a `kill -9` of doit must not leave its stage running as an orphan."""
    with suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill_group(pid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
