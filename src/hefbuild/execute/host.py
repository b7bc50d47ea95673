"""Run a rule as a child process of this one, in its own process group, under limits."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

from ..errors import StageError
from .base import ExecRequest, ExecResult, StageRun
from .perms import owner_readable
from .watch import MIB, StageWatch

_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1
TAIL_BYTES = 64 << 10  # enough for any one error line worth reading

# Host variables a rule may need that cannot change its bytes; never part of a key.
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "USER")
# ... and for a stage with network access (fetch) alone: where the hub is, its credentials.
NETWORK_ENV = (
    "HF_HOME", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE",
    "HF_HUB_CACHE", "HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_TELEMETRY",
    "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
)


class SandboxUnavailable(StageError):
    pass


class HostExecutor:
    def run_stage(self, stage: StageRun) -> ExecResult:
        action_file = stage.scratch / "action.json"
        action_file.write_text(stage.action_json(str))
        env = stage_env(stage)
        argv = [stage.interpreter, str(stage.rules_dir / stage.rule), str(action_file)]
        try:
            if stage.sandbox:
                result = self._run_sandboxed(stage, argv, env)
            else:
                from .sandbox import reaped

                result = self.run(self._request(stage, reaped(argv), env))
        finally:
            # A file or folder the rule left mode 0000 would stop a non-root doit from
            # storing it (and from removing the scratch folder).
            for folder in (stage.out, stage.work):
                owner_readable(folder)
        return replace(result, isolation="bwrap" if stage.sandbox else "none")

    def _run_sandboxed(self, stage: StageRun, argv: list[str],
                       env: dict[str, str]) -> ExecResult:
        from .sandbox import probe_bwrap, sandboxed, seccomp_fd

        bwrap = probe_bwrap()
        if bwrap.path is None:
            raise SandboxUnavailable(bwrap.problem)
        with seccomp_fd() as fd:
            argv = sandboxed(bwrap.path, stage, argv, env, stage.network, stage.writable, fd)
            fds = () if fd is None else (fd,)
            return self.run(replace(self._request(stage, argv, env), pass_fds=fds))

    @staticmethod
    def _request(stage: StageRun, argv: list[str], env: dict[str, str]) -> ExecRequest:
        return ExecRequest(argv, stage.work, env, stage.log_path, stage.limits.timeout_s,
                           stage.limits.memory_bytes, stage.watch)

    def run(self, request: ExecRequest) -> ExecResult:
        start = time.monotonic()
        with open(request.log_path, "ab") as log:
            proc = subprocess.Popen(
                request.argv, cwd=request.cwd, env=request.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent(), pass_fds=request.pass_fds,
            )
            try:
                return _supervise(proc, request, start)
            except BaseException:
                # Ctrl-C or a crash of ours: take the whole stage down with us.
                _kill_group(proc.pid)
                with suppress(ChildProcessError):
                    os.wait4(proc.pid, 0)
                raise


def stage_env(stage: StageRun) -> dict[str, str]:
    """The rule's whole environment: the toolchain's, a few harmless host variables, and
    the hub's only for a stage with network access. HOME is the stage's own work folder
    in a sandbox (a rule's caches stay in the stage), the user's outside one."""
    names = PASSTHROUGH_ENV + (NETWORK_ENV if stage.network else ())
    env = {k: os.environ[k] for k in names if k in os.environ}
    if stage.sandbox:
        env.update(HOME=str(stage.work), TMPDIR="/tmp")
    elif "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    if stage.network and stage.writable:
        env.setdefault("HF_HOME", str(stage.writable[0]))
    env.update(stage.env)
    # rules/ first; a toolchain may add its own paths after it.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(stage.rules_dir),
                                                    stage.env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # rules/ may be read-only
    env["PYTHONUNBUFFERED"] = "1"  # progress reaches the log (and the heartbeat) as printed
    return env


def _supervise(proc: subprocess.Popen, request: ExecRequest, start: float) -> ExecResult:
    """Poll until the child exits: enforce the limits, sample the tree, emit heartbeats.
    The child is reaped with wait4, which gives its own peak RSS."""
    watch = StageWatch(request.watch, request.log_path, start)
    tree = _Tree(proc.pid)
    killed_for = None
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            _kill_group(proc.pid)  # grandchildren left behind must not outlive the stage
            break
        now = time.monotonic()
        cpu, rss = tree.sample()
        beat = watch.sample(now, cpu, rss)
        if beat is not None and request.watch.emit is not None:
            request.watch.emit(beat)
        killed_for = killed_for or _over_limit(request, now - start, watch.peak_rss)
        if killed_for:
            _kill_group(proc.pid)
        time.sleep(_POLL_S)
    peak = max(watch.peak_rss, rusage.ru_maxrss * 1024)  # Linux reports KiB
    return ExecResult(
        returncode=os.waitstatus_to_exitcode(status),
        seconds=time.monotonic() - start,
        peak_rss_mb=peak / MIB,
        timed_out=killed_for == "timeout",
        cpu_seconds=max(watch.cpu_seconds, rusage.ru_utime + rusage.ru_stime),
        killed_for=killed_for,
    )


def _over_limit(request: ExecRequest, elapsed: float, peak_rss: int) -> str | None:
    if request.timeout_s is not None and elapsed > request.timeout_s:
        return "timeout"
    if request.memory_bytes is not None and peak_rss > request.memory_bytes:
        return "memory"
    return None


class _Tree:
    """CPU seconds and resident bytes of a process and all its descendants."""

    def __init__(self, pid: int) -> None:
        import psutil  # only when a stage runs: keeps the no-op path light

        self._error = psutil.Error
        self._root = psutil.Process(pid)
        self._procs: dict[int, psutil.Process] = {}

    def sample(self) -> tuple[float, int]:
        try:
            members = [self._root, *self._root.children(recursive=True)]
        except self._error:
            return 0.0, 0
        cpu, rss = 0.0, 0
        for p in members:
            proc = self._procs.setdefault(p.pid, p)  # reuse: cpu_times need the same object
            with suppress(self._error):
                times = proc.cpu_times()
                cpu += times.user + times.system + times.children_user + times.children_system
                rss += proc.memory_info().rss
        return cpu, rss


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: a `kill -9` of doit must not leave its stage running as an orphan.
    The prctl function is looked up here, before fork: nothing is imported in the child."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return in_child


def _kill_group(pid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def log_tail(path: Path) -> str:
    """The last non-empty line of a log (for one-line failure messages)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - TAIL_BYTES))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return "(no log)"
    from .watch import OWN_PREFIX

    # The rule's own last line, not a heartbeat written after it; and the whole line: its
    # end is usually the part that says what to do.
    lines = [ln for ln in lines if ln and not ln.startswith(OWN_PREFIX)]
    return lines[-1] if lines else "(no output)"
