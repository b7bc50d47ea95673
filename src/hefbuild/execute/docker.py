"""Run a rule in a container of its toolchain's pinned image (docker SDK).

What the rule sees: its rules read-only at /hefbuild/rules, each upstream stage read-only
at /hefbuild/inputs/<stage>, each file parameter read-only under /hefbuild/files/, the
action JSON at /hefbuild/action.json, and ONE writable folder, /hefbuild/out. The root
filesystem is read-only (scratch space in tmpfs /tmp and /hefbuild/work); no network; the
toolchain's environment plus an always-explicit CUDA_VISIBLE_DEVICES; a GPU only for
stages that declare one; memory and CPU limits; the invoking user's uid:gid, so outputs
are ours. The container is removed afterwards; its whole output is the stage log.

A container never outlives its doit, though a doit killed with -9 or by the OOM killer never
reaches its `finally`. First, it ends itself: its command is lifeline.py, which runs the
rule and kills it when the FIFO that doit holds open reports that doit is gone (the kernel
closes it however doit ends; nothing runs on the host for it, and a no-op doit that runs
no container pays nothing). Second, as a guard where that cannot work (a daemon in a VM):
each container is labelled with the stage, the process that supervises it
(`hefbuild.owner` pid and `hefbuild.owner_start`, its start time, since pids are reused),
this machine's name and the pid namespace, and before its first container an executor
removes every labelled container of this machine and namespace whose owner is gone (and
the stopped remains of those that ended themselves); containers of another machine sharing
the daemon, and those whose owner may be alive, are never touched.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..errors import StageError
from . import lifeline
from .base import ExecResult, StageRun
from .watch import MIB, StageWatch

ROOT = Path("/hefbuild")
LIFELINE = "lifeline.fifo"  # in the stage's scratch folder, and under ROOT in the container
_POLL_S = 0.2
STAGE, OWNER, OWNER_START, HOST = ("hefbuild.stage", "hefbuild.owner", "hefbuild.owner_start",
                                   "hefbuild.host")
PID_NS = "hefbuild.owner_pidns"  # a pid means something only in its pid namespace
UNKNOWN = "?"  # the start time of a process that exists but may not be inspected


def docker_endpoint() -> str | None:
    """Where the Docker engine is, found as the docker CLI finds it: DOCKER_HOST, else the
    current docker context (`docker context use`, DOCKER_CONTEXT), else None: the SDK's
    default socket. Tests find the engine through this same function."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    try:
        from docker.context import ContextAPI

        context = ContextAPI.get_context(os.environ.get("DOCKER_CONTEXT")) \
            if os.environ.get("DOCKER_CONTEXT") else ContextAPI.get_current_context()
    except Exception:  # noqa: BLE001 - an unreadable docker config: fall back to the default
        return None
    if context is None or context.Name == "default":
        return None
    return context.Host


def connect() -> Any:
    """A docker client for `docker_endpoint()`, or a one-line error."""
    try:
        import docker
    except ImportError as exc:
        raise StageError("docker toolchains need the docker SDK: pip install docker") from exc
    endpoint = docker_endpoint()
    try:
        client = docker.from_env(environment={**os.environ, "DOCKER_HOST": endpoint}
                                 if endpoint else None)
        client.ping()
    except Exception as exc:  # the SDK raises requests/urllib3/docker errors alike
        where = endpoint or "the default socket"
        raise StageError(f"no Docker engine answers at {where}: {str(exc)[:160]}") from exc
    return client


class DockerExecutor:
    def __init__(self, client: Any = None) -> None:
        self._client = client
        self._reap_lock = threading.Lock()
        self._reaped: list[str] | None = None  # None: orphans not looked for yet

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect()
        return self._client

    def run_stage(self, stage: StageRun) -> ExecResult:
        self._require_image(stage)
        _report_reaped(stage, self._reap_once())
        (stage.scratch / "action.json").write_text(stage.action_json(lambda p: _inside(stage, p)))
        with lifeline.hold(stage.scratch / LIFELINE):  # open until the container is gone
            container = self.client.containers.create(**container_config(stage, owner_labels()))
            start = time.monotonic()
            try:
                container.start()
                return _supervise(container, stage, start)
            finally:
                with suppress(Exception):
                    container.remove(force=True)

    def _require_image(self, stage: StageRun) -> None:
        import docker.errors

        try:
            self.client.images.get(stage.image)
        except docker.errors.ImageNotFound:
            raise StageError(
                f"{stage.task}: the pinned image {str(stage.image)[:19]}… is not in the local "
                f"Docker engine; build it with `doit image:<toolchain>` (see README: images)"
            ) from None

    def _reap_once(self) -> list[str]:
        """The orphans removed, by the first call of this executor only (the others wait for
        it: no stage container starts before the sweep is over)."""
        with self._reap_lock:
            if self._reaped is None:
                self._reaped = reap_orphans(self.client)
                return self._reaped
        return []


def owner_labels() -> dict[str, str]:
    """The labels that tie a container to this process on this machine."""
    pid = os.getpid()
    return {OWNER: str(pid), OWNER_START: process_start(pid) or UNKNOWN,
            HOST: socket.gethostname(), PID_NS: _pid_namespace()}


def _pid_namespace() -> str:
    """This process's pid namespace (a doit in a container with the host's name sees other
    pids), or "" where there are none."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """When process `pid` started; None when there is none (or only its zombie), UNKNOWN
    when one exists that we may not inspect (another user's, under /proc's hidepid).

    On Linux: /proc/<pid>/stat field 22, clock ticks since boot, which a wall-clock step
    (NTP) leaves alone; psutil's create_time is derived from the wall clock and could make a
    live owner of hours look like another process. Elsewhere: psutil."""
    if not Path("/proc/self/stat").is_file():
        return _psutil_start(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return UNKNOWN if _exists(pid) else None
    fields = stat.rsplit(")", 1)[1].split()  # the command name, in (), may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]  # fields[0] is field 3, state


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, and not ours
        return True
    return True


def _psutil_start(pid: int) -> str | None:
    import psutil

    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else f"{proc.create_time():.3f}"
    except psutil.NoSuchProcess:  # ZombieProcess included
        return None
    except psutil.AccessDenied:
        return UNKNOWN


def owner_gone(recorded_start: str, current_start: str | None) -> bool:
    """Is the doit that labelled a container gone? `current_start` is process_start() of the
    labelled pid now. Pure: only a certainty of death removes a container."""
    if current_start is None:
        return True  # no process has that pid any more
    if UNKNOWN in (current_start, recorded_start):
        return False  # a process has that pid, and we cannot tell whether it is the owner
    return current_start != recorded_start  # the pid was reused by another process


def _orphaned(labels: dict[str, str]) -> bool:
    pid = labels.get(OWNER, "")
    if not pid.isdigit() or int(pid) <= 0:
        return False  # not a label we wrote: not ours to judge
    return owner_gone(labels.get(OWNER_START, UNKNOWN), process_start(int(pid)))


def reap_orphans(client: Any) -> list[str]:
    """Remove (force) every stage container of this machine whose doit is gone; their names.

    Removal races with other sweepers and with the owner's own cleanup: a container already
    gone or being removed is someone else's success, not an error."""
    import docker.errors

    ours = owner_labels()
    if ours[OWNER_START] == UNKNOWN:
        return []  # no way to tell processes apart here: judge no one
    filters = {"label": [OWNER, f"{HOST}={ours[HOST]}", f"{PID_NS}={ours[PID_NS]}"]}
    try:
        found = client.containers.list(all=True, filters=filters, sparse=True)
    except docker.errors.DockerException as exc:
        raise StageError(f"cannot list hefbuild's containers: {str(exc)[:160]}") from exc
    removed = []
    for container in found:
        if not _orphaned(container.attrs.get("Labels") or {}):
            continue
        with suppress(docker.errors.NotFound, docker.errors.APIError):
            container.remove(force=True)
            names = container.attrs.get("Names") or [container.short_id]
            removed.append(names[0].lstrip("/"))
    return removed


def _report_reaped(stage: StageRun, removed: list[str]) -> None:
    """One line in the stage log, and to the person at the terminal (as a heartbeat)."""
    if not removed:
        return
    n = len(removed)
    line = (f"hefbuild: removed {n} container{'s' if n != 1 else ''} left by a doit that "
            f"died: {', '.join(removed)}")
    with open(stage.log_path, "a") as log:
        log.write(line + "\n")
    if stage.watch.emit is not None:
        stage.watch.emit({"message": line.removeprefix("hefbuild: "), "removed_orphans": removed})


def container_config(stage: StageRun, owner: dict[str, str] | None = None,
                     user: tuple[int, int] | None = None) -> dict[str, Any]:
    """Everything about the container, as docker SDK `containers.create` arguments (pure);
    `owner`: the owner_labels() it carries; `user`: the uid and gid it runs as (ours)."""
    uid, gid = user or (os.getuid(), os.getgid())
    env = dict(stage.env)
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")  # unset, the DFC hides every GPU
    env.update(PYTHONPATH=str(ROOT / "rules"), PYTHONDONTWRITEBYTECODE="1", HOME="/tmp",
               PYTHONUNBUFFERED="1")
    config: dict[str, Any] = {
        "image": stage.image,
        # -I: the wrapper sees the standard library only, never a module of rules/.
        "command": [stage.interpreter, "-I", str(ROOT / "lifeline.py"), str(ROOT / LIFELINE),
                    stage.interpreter, str(ROOT / "rules" / stage.rule),
                    str(ROOT / "action.json")],
        "working_dir": str(ROOT / "work"),
        "environment": env,
        "volumes": _volumes(stage),
        "network_mode": "none",
        "read_only": True,
        # Docker makes a mount point the image lacks root's, mode 755: as anyone but root (a
        # normal user's CI runner) the rule could not write its own working folder.
        "tmpfs": {"/tmp": "mode=1777", str(ROOT / "work"): f"mode=0700,uid={uid},gid={gid}"},
        "user": f"{uid}:{gid}",
        "detach": True,
        "labels": {"hefbuild.task": stage.task, STAGE: stage.task, **(owner or {})},
    }
    if stage.limits.memory_bytes:
        config["mem_limit"] = stage.limits.memory_bytes
        config["memswap_limit"] = stage.limits.memory_bytes  # no swap: the cap is the cap
    if stage.limits.cpus:
        config["nano_cpus"] = int(stage.limits.cpus * 1e9)
    if stage.limits.gpu:
        from docker.types import DeviceRequest

        ids = [d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d]
        config["device_requests"] = [DeviceRequest(device_ids=ids or None,
                                                   count=None if ids else -1,
                                                   capabilities=[["gpu"]])]
    return config


def _volumes(stage: StageRun) -> list[str]:
    """host:container:mode binds (a list: two names may share one host file)."""
    binds = [f"{stage.rules_dir}:{ROOT / 'rules'}:ro",
             f"{stage.scratch / 'action.json'}:{ROOT / 'action.json'}:ro",
             f"{Path(lifeline.__file__).resolve()}:{ROOT / 'lifeline.py'}:ro",
             f"{stage.scratch / LIFELINE}:{ROOT / LIFELINE}:ro",
             f"{stage.out}:{ROOT / 'out'}:rw"]
    binds += [f"{path}:{ROOT / 'inputs' / name}:ro" for name, path in stage.inputs.items()]
    binds += [f"{path}:{ROOT / 'files' / name / path.name}:ro"
              for name, path in stage.files.items()]
    return binds


def _inside(stage: StageRun, path: Path) -> str:
    """Where a host path of the stage is mounted in the container."""
    for name, p in stage.inputs.items():
        if path == p:
            return str(ROOT / "inputs" / name)
    for name, p in stage.files.items():
        if path == p:
            return str(ROOT / "files" / name / p.name)
    if path == stage.out:
        return str(ROOT / "out")
    raise ValueError(f"{path} is not mounted in the container")


def _supervise(container: Any, stage: StageRun, start: float) -> ExecResult:
    watch = StageWatch(stage.watch, stage.log_path, start)
    with suppress(OSError):  # what hefbuild itself wrote there is not the stage's output
        watch.log_size = stage.log_path.stat().st_size
    pump = threading.Thread(target=_pump_logs, args=(container, stage.log_path), daemon=True)
    pump.start()
    killed_for = None
    while True:
        container.reload()
        if container.status in ("exited", "dead"):
            break
        now = time.monotonic()
        cpu, rss, peak = _usage(container)
        beat = watch.sample(now, cpu, rss)
        watch.peak_rss = max(watch.peak_rss, peak)
        if beat is not None and stage.watch.emit is not None:
            stage.watch.emit(beat)
        if stage.limits.timeout_s is not None and now - start > stage.limits.timeout_s:
            killed_for = "timeout"
            with suppress(Exception):
                container.kill()
        time.sleep(_POLL_S)
    code = int(container.attrs["State"].get("ExitCode", -1))
    if container.attrs["State"].get("OOMKilled"):
        killed_for = killed_for or "memory"
    pump.join(timeout=5)
    peak = max(watch.peak_rss, _cgroup_peak(container))
    return ExecResult(returncode=code, seconds=time.monotonic() - start,
                      peak_rss_mb=peak / MIB, timed_out=killed_for == "timeout",
                      cpu_seconds=watch.cpu_seconds, killed_for=killed_for)


def _pump_logs(container: Any, log_path: Path) -> None:
    with open(log_path, "ab") as log:
        for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
            log.write(chunk)
            log.flush()


def _usage(container: Any) -> tuple[float, int, int]:
    """(CPU seconds, resident bytes, peak bytes) of the container, from one stats snapshot."""
    try:
        stats = container.stats(stream=False, one_shot=True)
    except Exception:  # the container may be gone between reload and stats
        return 0.0, 0, 0
    cpu_ns = stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0)
    mem = stats.get("memory_stats", {})
    rss = max(mem.get("usage", 0) - mem.get("stats", {}).get("inactive_file", 0), 0)
    return cpu_ns / 1e9, rss, max(rss, mem.get("max_usage", 0))  # max_usage: cgroup v1


def _cgroup_peak(container: Any) -> int:
    """The kernel's own peak for the container (cgroup v2 memory.peak), when readable."""
    cid = container.id
    for path in (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.peak",
                 f"/sys/fs/cgroup/docker/{cid}/memory.peak",
                 f"/sys/fs/cgroup/memory/docker/{cid}/memory.max_usage_in_bytes"):  # v1
        with suppress(OSError, ValueError):
            return int(Path(path).read_text())
    return 0
