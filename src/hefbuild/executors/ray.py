"""Stages on a Ray cluster, each on a node that offers what it needs.

The driver (this process) never sends bytes through Ray: it makes sure every file the stage
reads is in the remote cache's CAS, submits a streaming task carrying only the action and
digests (executors/ray_worker.py), relays the node's log and heartbeats as they come, and
fetches the outputs by digest, verified, into the stage's out/, where the engine checks and
stores them exactly as after a local run. A lost worker, a failed task or Ctrl-C leaves no
result (the engine stores only what a finished run returned).

Stages that read the network or a folder of this machine (a source stage) run here.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ..errors import StageError
from ..remote.cas import BadBlob, BlobStore, MissingBlob
from ..remote.transport import RemoteError
from ..resources import shown
from ..settings import CacheSettings
from ..store import Store
from .base import ExecResult, Executor, StageRun
from .ray_worker import RemoteStage, run_remote_stage

_CONNECT_LOCK = threading.Lock()
_BUILTIN = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
CUSTOM = "resources"  # Ray's task option for custom resources


class RayCluster:
    """The connection to one cluster (made on the first remote stage of a process)."""

    def __init__(self, address: str | None) -> None:
        self.address = address or "auto"
        self._task: Any = None

    def connect(self) -> Any:
        # Ray's C++ core logs warnings (e.g. no route to the internet) to our stderr.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
        import ray  # only when a stage goes to the cluster

        with _CONNECT_LOCK:
            if not ray.is_initialized():
                try:
                    ray.init(address=self.address, namespace="hefbuild", log_to_driver=False,
                             logging_level="ERROR", configure_logging=False)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    raise StageError(f"cannot reach the Ray cluster at {self.address} "
                                     f"({str(exc).splitlines()[0][:160]}); start it or unset "
                                     f"HEFBUILD_RAY_ADDRESS / [executor] to build here"
                                     ) from exc
            if self._task is None:
                self._task = ray.remote(run_remote_stage)
        return ray

    def nodes(self) -> list[dict[str, Any]]:
        ray = self.connect()
        return [n for n in ray.nodes() if n.get("Alive")]

    def submit(self, stage: RemoteStage, options: dict[str, Any]) -> Any:
        self.connect()
        return self._task.options(num_returns="streaming", max_retries=0,
                                  **options).remote(stage)


def ray_options(resources: dict[str, float], gpu: bool) -> dict[str, Any]:
    """The stage's declared resources as Ray task options (a GPU stage asks for one GPU)."""
    options: dict[str, Any] = {"num_cpus": 1}
    custom = {}
    for name, amount in resources.items():
        if name in _BUILTIN:
            options[_BUILTIN[name]] = int(amount) if name == "memory" else amount
        else:
            custom[name] = amount
    if gpu and "num_gpus" not in options:
        options["num_gpus"] = 1
    if custom:
        options[CUSTOM] = custom
    return options


def wanted(options: dict[str, Any]) -> dict[str, float]:
    """The Ray options as node resources (`num_gpus` is the node's `GPU`)."""
    back = {v: k for k, v in _BUILTIN.items()}
    need = {back[k]: float(v) for k, v in options.items() if k in back and v}
    need.update(options.get(CUSTOM, {}))
    return need


def unplaceable(need: dict[str, float], nodes: list[dict[str, Any]]) -> str | None:
    """Why no node can run a stage that needs `need`, or None when one can."""
    offers = [n.get("Resources", {}) for n in nodes]
    if any(all(o.get(k, 0) >= v for k, v in need.items()) for o in offers):
        return None
    missing = [k for k, v in sorted(need.items()) if not any(o.get(k, 0) >= v for o in offers)]
    if missing:
        return ("no node offers " + ", ".join(f"{k}={need[k]:g}" for k in missing)
                + f" (the {len(nodes)} nodes offer: "
                + ", ".join(sorted({k for o in offers for k in o if not k.startswith("node:")}))
                + ")")
    return f"no single node offers {shown(need)} together"


class RayExecutor:
    """The cluster's executor for one toolchain kind; `local` runs what must stay here."""

    def __init__(self, cluster: RayCluster, kind: str, local: Executor,
                 cache: CacheSettings, store: Store) -> None:
        self.cluster, self.kind, self.local = cluster, kind, local
        self.cache, self.store = cache, store

    def run_stage(self, stage: StageRun) -> ExecResult:
        if stage.network or "source_dir" in stage.files:
            return self.local.run_stage(stage)  # reads this machine's folder or the hub
        if self.cache.remote is None:
            raise StageError(f"{stage.task}: the Ray executor moves inputs and outputs through "
                             f"the remote cache; set [cache] remote in hefbuild.toml (or "
                             f"HEFBUILD_REMOTE_CACHE)")
        options = ray_options(stage.limits.resources, stage.limits.gpu)
        why = unplaceable(wanted(options), self.cluster.nodes())
        if why is not None:
            raise StageError(f"{stage.task} needs {shown(wanted(options))}: {why} in the Ray "
                             f"cluster at {self.cluster.address}")
        blobs = BlobStore(self.cache)
        try:
            remote = self._describe(stage, blobs)
            return _Relay(stage, blobs, self.store).follow(self.cluster, remote, options)
        except (RemoteError, MissingBlob, BadBlob) as exc:
            raise StageError(f"{stage.task}: remote cache {self.cache.shown}: {exc}, while "
                             f"moving the stage's files to or from the cluster; nothing was "
                             f"stored") from exc

    def _describe(self, stage: StageRun, blobs: BlobStore) -> RemoteStage:
        """Every file the stage reads is put in the CAS (if missing) and named by digest."""
        def digest_of(path: Path) -> str:
            digest = stage.digests.get(path)
            if digest is None:
                raise StageError(f"{stage.task}: no digest for {path.name} (the engine passes "
                                 f"one for every file a stage reads)")
            blobs.ensure(path, digest)
            return digest

        rules = {p.relative_to(stage.rules_dir).as_posix(): digest_of(p)
                 for p in stage.digests if p.is_relative_to(stage.rules_dir)}
        inputs = {up: {p.relative_to(d).as_posix(): digest_of(p)
                       for p in stage.digests if p.is_relative_to(d)}
                  for up, d in stage.inputs.items()}
        files = {name: (p.name, digest_of(p)) for name, p in stage.files.items()}
        w = stage.watch
        return RemoteStage(
            task=stage.task, kind=self.kind, interpreter=stage.interpreter, rule=stage.rule,
            action=stage.action, rules=rules, inputs=inputs, files=files, env=stage.env,
            limits=stage.limits, cache=self.cache.remote or "",
            cache_timeout_s=self.cache.timeout_s, sandbox=stage.sandbox, image=stage.image,
            heartbeat_s=w.interval_s, silence_s=w.silence_s, usual_s=w.usual_s,
            usual_builds=w.usual_builds, phases=w.phases)


class _Relay:
    """Follows one remote stage: its log into the driver's running log, its heartbeats to
    the driver's terminal and events, and its outputs, by digest, into out/."""

    def __init__(self, stage: StageRun, blobs: BlobStore, store: Store) -> None:
        self.stage, self.blobs, self.store = stage, blobs, store
        self.node: dict[str, Any] | None = None

    def follow(self, cluster: RayCluster, remote: RemoteStage,
               options: dict[str, Any]) -> ExecResult:
        ray = cluster.connect()
        items = cluster.submit(remote, options)
        exit_fields: dict[str, Any] = {}
        result: dict[str, Any] = {}
        try:
            for ref in items:
                item = ray.get(ref)
                exit_fields = item.get("exit", exit_fields)
                result = item.get("result", result)
                self._relay(item)
        except BaseException as exc:
            ray.cancel(items, force=True)  # Ctrl-C here stops the rule there
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise StageError(self._lost(exc)) from exc
        self._fetch(result)
        return ExecResult(**exit_fields, node=self.node)

    def _relay(self, item: dict[str, Any]) -> None:
        if "node" in item:
            self.node = item["node"]
            self._log(f"[hefbuild] running on node {self.node['name']} of the Ray cluster\n")
        if "log" in item:
            self._log(item["log"])
        if "beat" in item and self.stage.watch.emit is not None:
            beat = dict(item["beat"])
            beat["node"] = self.node["name"] if self.node else None
            self.stage.watch.emit(beat)

    def _log(self, text: str) -> None:
        with open(self.stage.log_path, "a", encoding="utf-8") as log:
            log.write(text)

    def _fetch(self, result: dict[str, Any]) -> None:
        for rel, digest in sorted(result.get("outputs", {}).items()):
            self.blobs.fetch(digest, self.store, self.stage.out / rel)

    def _lost(self, exc: BaseException) -> str:
        where = f" on node {self.node['name']}" if self.node else ""
        cause = type(exc).__name__
        detail = str(exc).strip().splitlines()
        line = next((d for d in reversed(detail) if d.strip()), "")[:200]
        return (f"{self.stage.task}: the Ray task{where} ended without a result ({cause}: "
                f"{line}); nothing was stored, running it again is safe")
