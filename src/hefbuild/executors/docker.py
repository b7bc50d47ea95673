"""Run a rule in a container of its toolchain's pinned image (docker SDK).

What the rule sees: its rules read-only at /hefbuild/rules, each upstream stage read-only
at /hefbuild/inputs/<stage>, each file parameter read-only under /hefbuild/files/, the
action JSON at /hefbuild/action.json, and ONE writable folder, /hefbuild/out. The root
filesystem is read-only (scratch space in tmpfs /tmp and /hefbuild/work); no network; the
toolchain's environment plus an always-explicit CUDA_VISIBLE_DEVICES; a GPU only for
stages that declare one; memory and CPU limits; the invoking user's uid:gid, so outputs
are ours. The container is removed afterwards; its whole output is the stage log.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..errors import StageError
from .base import ExecResult, StageRun
from .watch import MIB, StageWatch

ROOT = Path("/hefbuild")
_POLL_S = 0.2


def connect() -> Any:
    """A docker client from DOCKER_HOST (or the default socket), or a one-line error."""
    try:
        import docker
    except ImportError as exc:
        raise StageError("docker toolchains need the docker SDK: pip install docker") from exc
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # the SDK raises requests/urllib3/docker errors alike
        where = os.environ.get("DOCKER_HOST", "the default socket")
        raise StageError(f"no Docker engine answers at {where}: {str(exc)[:160]}") from exc
    return client


class DockerExecutor:
    def __init__(self, client: Any = None) -> None:
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect()
        return self._client

    def run_stage(self, stage: StageRun) -> ExecResult:
        self._require_image(stage)
        (stage.scratch / "action.json").write_text(stage.action_json(lambda p: _inside(stage, p)))
        container = self.client.containers.create(**container_config(stage))
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


def container_config(stage: StageRun) -> dict[str, Any]:
    """Everything about the container, as docker SDK `containers.create` arguments (pure)."""
    env = dict(stage.env)
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")  # unset, the DFC hides every GPU
    env.update(PYTHONPATH=str(ROOT / "rules"), PYTHONDONTWRITEBYTECODE="1", HOME="/tmp")
    config: dict[str, Any] = {
        "image": stage.image,
        "command": [stage.interpreter, str(ROOT / "rules" / stage.rule),
                    str(ROOT / "action.json")],
        "working_dir": str(ROOT / "work"),
        "environment": env,
        "volumes": _volumes(stage),
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": "", str(ROOT / "work"): ""},
        "user": f"{os.getuid()}:{os.getgid()}",
        "detach": True,
        "labels": {"hefbuild.task": stage.task},
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
    pump = threading.Thread(target=_pump_logs, args=(container, stage.log_path), daemon=True)
    pump.start()
    watch = StageWatch(stage.watch, stage.log_path, start)
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
