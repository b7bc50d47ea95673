"""Stages on a Ray cluster, each on a node that offers what it needs.

The driver (this process) never sends bytes through Ray: it makes sure every file the stage
reads is in the remote cache's CAS, submits a streaming task carrying only the action and
digests (execute/ray_worker.py), relays the node's log and heartbeats as they come, and
fetches the outputs by digest, verified, into the stage's out/, where the engine checks and
stores them exactly as after a local run. A lost worker, a failed task or Ctrl-C leaves no
result (the engine stores only what a finished run returned).

Stages that read the network or a folder of this machine (a source stage) run here.

A stage no live node can run is refused at once, unless the autoscaler declares a node type
that offers it (the GCS cluster config, `node_group_configs`): then it is submitted, the
autoscaler starts such a node for the pending task, and the driver says what it waits for.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..declare.resources import shown
from ..declare.settings import Settings
from ..errors import StageError
from ..remote.cas import BadBlob, BlobStore, MissingBlob
from ..remote.problems import RemoteError
from ..store.store import Store
from .base import ExecResult, Executor, StageRun
from .node_checks import hefbuild_identity, loopback_cache
from .ray_worker import RemoteStage, run_remote_stage

_CONNECT_LOCK = threading.Lock()
_BUILTIN = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
CUSTOM = "resources"  # Ray's task option for custom resources


class RayCluster:
    """The connection to one cluster (made on the first remote stage of a process)."""

    def __init__(self, address: str | None,
                 node_types: tuple[dict[str, float], ...] = ()) -> None:
        self.address = address or "auto"
        self.node_types = node_types
        self._task: Any = None
        self.driver_address = ""  # this host as the cluster sees it
        self.warned: set[str] = set()  # nodes already warned about, once per run

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
                self.driver_address = ray.util.get_node_ip_address()
        return ray

    def nodes(self) -> list[dict[str, Any]]:
        ray = self.connect()
        return [n for n in ray.nodes() if n.get("Alive")]

    def declared(self) -> list[dict[str, float]]:
        """What each node type the autoscaler may still start offers: the project's
        `[executor] node_types`, and the GCS cluster config where an autoscaler reports its
        node types there (Ray 2.60's own autoscalers do not, KubeRay's included)."""
        return [*map(dict, self.node_types), *self._reported()]

    def _reported(self) -> list[dict[str, float]]:
        self.connect()
        from ray._private.state import state  # the accessor Ray Data reads it with

        try:
            config = state.get_cluster_config()
        except Exception:  # noqa: BLE001 - an older GCS without it: no declared types
            return []
        groups = config.node_group_configs if config is not None else []
        return [dict(g.resources) for g in groups if g.max_count != 0]

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


def lacking(need: dict[str, float], nodes: list[dict[str, Any]]) -> dict[str, float]:
    """What a waiting stage waits for: the resources no node offers (all it needs when
    each is offered somewhere but no single node offers them together)."""
    offers = [n.get("Resources", {}) for n in nodes]
    missing = {k: v for k, v in need.items() if not any(o.get(k, 0) >= v for o in offers)}
    return missing or dict(need)


def as_nodes(declared: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Declared node types in the shape of `ray.nodes()` entries."""
    return [{"Resources": offer} for offer in declared]


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

    def __init__(self, cluster: RayCluster, kind: str, local: Executor, settings: Settings,
                 store: Store, warn: Callable[[str], None] | None = None) -> None:
        self.cluster, self.kind, self.local = cluster, kind, local
        self.cache, self.gc, self.store = settings.cache, settings.gc, store
        self.warn = warn or (lambda message: None)

    def run_stage(self, stage: StageRun) -> ExecResult:
        if stage.network or "source_dir" in stage.files:
            return self.local.run_stage(stage)  # reads this machine's folder or the hub
        if self.cache.remote is None:
            raise StageError(f"{stage.task}: the Ray executor moves inputs and outputs through "
                             f"the remote cache; set [cache] remote in hefbuild.toml (or "
                             f"HEFBUILD_REMOTE_CACHE)")
        options = ray_options(stage.limits.resources, stage.limits.gpu)
        waiting = self._placeable(stage, wanted(options))
        blobs = BlobStore(self.cache)
        try:
            remote = self._describe(stage, blobs)
            relay = _Relay(stage, blobs, self.store, self._on_node)
            return relay.follow(self.cluster, remote, options, waiting)
        except (RemoteError, MissingBlob, BadBlob) as exc:
            raise StageError(f"{stage.task}: remote cache {self.cache.shown}: {exc}, while "
                             f"moving the stage's files to or from the cluster; nothing was "
                             f"stored") from exc

    def _placeable(self, stage: StageRun, need: dict[str, float]) -> dict[str, float] | None:
        """None when a live node can run the stage; what it waits for when only a node type
        the autoscaler declares can; else the stage is refused before it is submitted."""
        live = self.cluster.nodes()
        why = unplaceable(need, live)
        if why is None:
            return None
        declared = self.cluster.declared()
        if declared and unplaceable(need, as_nodes(declared)) is None:
            return lacking(need, live)
        if declared:
            why += ("; nor does any node type the autoscaler may start (they offer: "
                    + ", ".join(sorted({k for d in declared for k in d})) + ")")
        raise StageError(f"{stage.task} needs {shown(need)}: {why} in the Ray cluster at "
                         f"{self.cluster.address}")

    def _on_node(self, node: dict[str, Any]) -> None:
        """A node started a stage: once per node and run, warn when it cannot reach a
        cache on this host's loopback."""
        name = node.get("name", "?")
        message = loopback_cache(self.cluster.driver_address, name, node.get("address", ""),
                                 self.cache.shown)
        if message is not None and name not in self.cluster.warned:
            self.cluster.warned.add(name)
            self.warn(message)

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
            usual_builds=w.usual_builds, phases=w.phases, toolchain=stage.toolchain,
            identity=stage.identity, hefbuild=hefbuild_identity(),
            gc_max_bytes=self.gc.max_bytes, gc_max_age_s=self.gc.max_age_s)


class _Relay:
    """Follows one remote stage: its log into the driver's running log, its heartbeats to
    the driver's terminal and events, and its outputs, by digest, into out/."""

    def __init__(self, stage: StageRun, blobs: BlobStore, store: Store,
                 on_node: Callable[[dict[str, Any]], None]) -> None:
        self.stage, self.blobs, self.store, self.on_node = stage, blobs, store, on_node
        self.node: dict[str, Any] | None = None

    def follow(self, cluster: RayCluster, remote: RemoteStage, options: dict[str, Any],
               waiting: dict[str, float] | None = None) -> ExecResult:
        ray = cluster.connect()
        items = cluster.submit(remote, options)
        exit_fields: dict[str, Any] = {}
        result: dict[str, Any] = {}
        refused = None
        try:
            self._until_started(ray, items, waiting)
            for ref in items:
                item = ray.get(ref)
                exit_fields = item.get("exit", exit_fields)
                result = item.get("result", result)
                refused = item.get("refused", refused)
                self._relay(item)
        except BaseException as exc:
            ray.cancel(items, force=True)  # Ctrl-C here stops the rule there
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise StageError(self._lost(exc)) from exc
        if refused is not None:
            raise StageError(f"{self.stage.task}: {refused}: nothing stored")
        self._fetch(result)
        return ExecResult(**exit_fields, node=self.node)

    def _until_started(self, ray: Any, items: Any, waiting: dict[str, float] | None) -> None:
        """Until a node has taken the stage: said at once when no live node offers what it
        needs (an autoscaler is starting one), and each heartbeat interval meanwhile."""
        started = time.monotonic()
        if waiting is not None:
            self._say_waiting(waiting, 0.0)
        while not ray.wait([items], timeout=self.stage.watch.interval_s)[0]:
            self._say_waiting(waiting or wanted(ray_options(self.stage.limits.resources,
                                                            self.stage.limits.gpu)),
                              time.monotonic() - started)

    def _say_waiting(self, need: dict[str, float], elapsed: float) -> None:
        message = f"waiting for a node with {shown(need)}"
        self._log(f"[hefbuild] {message}\n")
        if self.stage.watch.emit is not None:
            self.stage.watch.emit({"message": message, "waiting_for": need,
                                   "elapsed_s": round(elapsed, 1), "node": None})

    def _relay(self, item: dict[str, Any]) -> None:
        if "node" in item:
            self.node = item["node"]
            self._log(f"[hefbuild] running on node {self.node['name']} of the Ray cluster\n")
            self.on_node(self.node)
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
