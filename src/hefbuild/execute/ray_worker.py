"""The node's half of a stage on a Ray cluster: fetch, run, upload, report.

`run_remote_stage` is a streaming Ray task. It receives a `RemoteStage` (the action and the
digests of what it reads, no bytes), fetches every input from the remote cache's CAS into
the node's own store (verified), runs the rule with the node's executor for the toolchain
(host sandbox or docker), uploads the outputs and the log, and yields, in order: where it
runs, the log as it grows and the heartbeats, then the result record. Nothing it writes is
trusted by the driver until the driver has fetched and verified it by digest.

Before it fetches anything it checks that it runs the driver's hefbuild and the toolchain
the key describes (execute/node_checks.py); on a difference it yields one `refused` line
and stops, having stored nothing. After the stage, the node's store is kept within the
project's [gc] bounds (store/gc.py: collect_node).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..declare.phases import PhaseTable
from .base import ExecResult, Limits, StageRun, Watch

LOG_POLL_S = 0.5
LOG_CHUNK = 64 << 10


@dataclass(frozen=True)
class RemoteStage:
    """A stage as it travels to a node: descriptions and digests only."""

    task: str
    kind: str  # the toolchain's kind: "host", "docker", "local", ...
    interpreter: str
    rule: str
    action: dict[str, Any]
    rules: dict[str, str]  # path under rules/ -> digest
    inputs: dict[str, dict[str, str]]  # upstream stage -> {relative path: digest}
    files: dict[str, tuple[str, str]]  # file parameter -> (file name, digest)
    env: dict[str, str]
    limits: Limits
    cache: str  # the remote cache URL (never its credentials)
    cache_timeout_s: float
    sandbox: bool = True
    image: str | None = None
    heartbeat_s: float = 60.0
    silence_s: float = 900.0
    usual_s: float | None = None
    usual_builds: int = 0
    phases: PhaseTable | None = None
    toolchain: str = ""  # the toolchain's name, for messages
    identity: dict[str, Any] = field(default_factory=dict)  # the key's toolchain identity
    hefbuild: dict[str, str] = field(default_factory=dict)  # the driver's (node_checks)
    gc_max_bytes: int | None = None  # the project's [gc] bounds, for the node's store
    gc_max_age_s: float | None = None


def node_identity() -> dict[str, Any]:
    """This node as messages and manifests name it: its Ray node name (`--node-name`), id
    and address."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    name, address = socket.gethostname(), ""
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            name = node.get("NodeName") or name
            address = node.get("NodeManagerAddress", "")
    return {"name": name, "id": node_id, "address": address}


def run_remote_stage(stage: RemoteStage) -> Iterator[dict[str, Any]]:
    from ..declare.project import default_store_root
    from ..declare.settings import worker_cache
    from ..remote.cas import BlobStore
    from ..store.statcache import StatCache
    from ..store.store import STORE_FORMAT, Store
    from ..store.storelock import StoreLock

    node = node_identity()
    yield {"node": node}
    why = refusal(stage, node["name"])
    if why is not None:
        yield {"refused": why}
        return
    root = default_store_root()
    store = Store(root, StatCache(root / STORE_FORMAT / "digests.sqlite3"))
    blobs = BlobStore(worker_cache(stage.cache, stage.cache_timeout_s))
    lock = StoreLock(root / STORE_FORMAT)  # no gc between an object written and linked
    with store.scratch() as scratch:
        with lock.shared():
            run = _lay_out(stage, scratch, store, blobs)
        yield from _run_streaming(stage, run)
        with lock.shared():
            result = _upload(run, store, blobs, stage)
    said = _collect(stage, root / STORE_FORMAT)  # once the scratch no longer pins its inputs
    if said:
        yield {"log": said}
    yield {"result": result}


def refusal(stage: RemoteStage, node: str) -> str | None:
    """Why this node must not run `stage` (another hefbuild, another toolchain), or None."""
    from ..errors import HefbuildError
    from .node_checks import hefbuild_differs, hefbuild_identity, probe_wanted, toolchain_differs
    from .toolchain import probe

    why = hefbuild_differs(node, stage.hefbuild, hefbuild_identity())
    packages = probe_wanted(stage.identity.get("kind", stage.kind), stage.identity)
    if why is not None or packages is None:
        return why
    try:
        found = probe(stage.interpreter, packages)
    except HefbuildError as exc:
        return f"node {node}: {exc} (toolchain {stage.toolchain})"
    return toolchain_differs(node, stage.toolchain, stage.identity, found)


def _collect(stage: RemoteStage, v1_root: Path) -> str:
    """The node's store within the project's [gc] bounds; a log line when it freed any."""
    if stage.gc_max_bytes is None and stage.gc_max_age_s is None:
        return ""
    from ..store.gc import GcPolicy, collect_node

    plan = collect_node(v1_root, GcPolicy(stage.gc_max_bytes, stage.gc_max_age_s, time.time()))
    if plan is None or not plan.drop_objects:
        return ""
    return (f"[hefbuild] node store: {len(plan.drop_objects)} objects removed "
            f"({plan.freed_bytes} bytes) to stay within [gc]\n")


def _lay_out(stage: RemoteStage, scratch: Path, store: Any, blobs: Any) -> StageRun:
    """Rules, inputs and file parameters as read-only links into the node's store."""
    rules = scratch / "rules"
    for rel, digest in stage.rules.items():
        blobs.fetch(digest, store, rules / rel)
    inputs = {}
    for up, files in stage.inputs.items():
        inputs[up] = scratch / "inputs" / up
        inputs[up].mkdir(parents=True)
        for rel, digest in files.items():
            blobs.fetch(digest, store, inputs[up] / rel)
    files = {}
    for name, (filename, digest) in stage.files.items():
        files[name] = scratch / "files" / name / filename
        blobs.fetch(digest, store, files[name])
    run = scratch / "run"
    for sub in ("out", "work"):
        (run / sub).mkdir(parents=True)
    return StageRun(task=stage.task, interpreter=stage.interpreter, rules_dir=rules,
                    rule=stage.rule, action=stage.action, inputs=inputs, files=files,
                    scratch=run, env=stage.env, limits=stage.limits, image=stage.image,
                    sandbox=stage.sandbox)


def _run_streaming(stage: RemoteStage, run: StageRun) -> Iterator[dict[str, Any]]:
    """The rule in a thread; its log and heartbeats as they come, then its exit."""
    beats: queue.Queue[dict[str, Any]] = queue.Queue()
    watch = Watch(stage.heartbeat_s, stage.silence_s, beats.put, stage.usual_s,
                  stage.usual_builds, stage.phases)
    run = replace(run, watch=watch)
    outcome: dict[str, Any] = {}
    worker = threading.Thread(target=_run_into, args=(stage, run, outcome), daemon=True)
    worker.start()
    sent = 0
    while True:
        finished = not worker.is_alive()
        chunk, sent = _new_log(run.log_path, sent)
        if chunk:
            yield {"log": chunk}
        while not beats.empty():
            yield {"beat": beats.get()}
        if finished:
            break
        worker.join(LOG_POLL_S)
    if "error" in outcome:
        raise outcome["error"]
    yield {"exit": _exec_fields(outcome["result"])}


def _run_into(stage: RemoteStage, run: StageRun, outcome: dict[str, Any]) -> None:
    try:
        outcome["result"] = _executor(stage.kind).run_stage(run)
    except BaseException as exc:  # re-raised in the task's own thread
        outcome["error"] = exc


def _executor(kind: str) -> Any:
    if kind == "docker":
        from .docker import DockerExecutor

        return DockerExecutor()
    from .host import HostExecutor

    return HostExecutor()


def _new_log(path: Path, sent: int) -> tuple[str, int]:
    try:
        with open(path, "rb") as log:
            log.seek(sent)
            data = log.read(LOG_CHUNK * 16)
    except FileNotFoundError:
        return "", sent
    return data.decode("utf-8", "replace"), sent + len(data)


def _exec_fields(result: ExecResult) -> dict[str, Any]:
    return {"returncode": result.returncode, "seconds": result.seconds,
            "peak_rss_mb": result.peak_rss_mb, "timed_out": result.timed_out,
            "cpu_seconds": result.cpu_seconds, "killed_for": result.killed_for,
            "isolation": result.isolation}


def _send(store: Any, blobs: Any, digest: str) -> None:
    """A store object into the CAS: hashed as it goes unless the store vouches for it (it
    was hashed as it was stored, a moment ago)."""
    blobs.ensure(store.object_path(digest), digest, check=not store.vouched(digest))


def _upload(run: StageRun, store: Any, blobs: Any, stage: RemoteStage) -> dict[str, Any]:
    """Every file the rule left in out/, and its log, into the CAS; their digests back."""
    outputs = {}
    for path in sorted(run.out.rglob("*")):
        if path.is_file() and not path.is_symlink():
            stored = store.put_file(path)
            _send(store, blobs, stored.digest)
            outputs[path.relative_to(run.out).as_posix()] = stored.digest
    log = store.put_file(run.log_path) if run.log_path.exists() else store.put_bytes(b"")
    _send(store, blobs, log.digest)
    return {"outputs": outputs, "log": log.digest, "uploaded_bytes": blobs.sent,
            "fetched_bytes": blobs.received, "at": time.time()}
