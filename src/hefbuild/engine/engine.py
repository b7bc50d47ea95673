"""The engine: for one action, compute its key, then leave it, restore it, or build it.

Deciding (`decide`) is separate from doing (`run`): `decide` reads state and returns a
`Decision` with its reason; only `run` writes the store, `build/` and the event log.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    HefbuildError,
    MissingOutput,
    RuleFailed,
    SpecError,
    StageError,
)
from ..store.events import EventLog, Outcome, peak_rss_mb, read_json

if TYPE_CHECKING:
    from ..declare.phases import PhaseTable
    from ..declare.specs import ToolchainSpec
    from ..declare.targets import TargetSpec
    from ..execute import ExecResult, Executor, StageRun, Watch
    from ..execute.ray import RayCluster
    from ..remote.cache import RemoteCache
from ..declare.checks import checks_of
from ..declare.project import Project
from ..execute.stagelog import LogFollower, bound_log, keep_failed_outputs, log_limit
from ..execute.toolchain import ToolchainResolver, interpreter_path
from ..plan.actions import Action, plan_project, rule_code_files
from ..plan.key import ActionKey, describe
from ..store.outputs import fits_declared
from ..store.statcache import StatCache
from ..store.store import STORE_FORMAT, Record, Store, sweep_staging
from ..store.storelock import StoreLock, register_project
from ..store.upload_queue import UploadQueue
from .collect import collect_outputs
from .failures import disk_error, failure_message, one_line
from .fastpath import FastPath, Verdict, fast_path_of
from .verdicts import check_figures, check_verdict

MANIFEST = "manifest.json"
LOG = "log.txt"


@dataclass(frozen=True)
class Decision:
    outcome: Outcome  # UPTODATE, RESTORED or BUILT: what `run` would do now
    reason: str
    key: ActionKey


class Engine:
    def __init__(self, project: Project, executor: Executor | None = None,
                 progress: Callable[[str], None] | None = None,
                 actions: dict[str, Action] | None = None,
                 fast: FastPath | None = None) -> None:
        self.project = project
        self.paths = project.paths
        self.actions = actions if actions is not None else plan_project(project)
        self.stats = StatCache(self.paths.store / STORE_FORMAT / "digests.sqlite3")
        self.store = Store(self.paths.store, self.stats)
        self.fast = fast or fast_path_of(project)
        self.store_lock = StoreLock(self.store.root)
        self._registered = False
        self.warnings: list[str] = []
        self._said_unsandboxed = False
        self._swept = False
        self._targets: dict[str, TargetSpec] | None = None  # read when a stage first builds
        self._remote: RemoteCache | None | bool = False  # False: not set up yet
        self._cluster: RayCluster | None = None  # [executor] kind = "ray": made when used
        self.toolchains = ToolchainResolver(self.paths.state / "toolchains.json",
                                            self.paths.toolchains)
        # One executor per toolchain kind, made when a stage first runs; a given executor
        # (tests) serves every kind. A device stage's rule runs here and reaches its device
        # itself (ssh or local).
        self._executors: dict[str, Executor] = {}
        if executor is not None:
            self._executors = dict.fromkeys(("host", "ssh", "local", "docker", "venv"), executor)
        self.progress = progress
        self.stream_logs = False  # `doit -v 2`: each rule's output to the terminal as it runs
        self.checks = checks_of({m.target: m.pipeline for m in project.models.values()}.values())
        self.events = EventLog(self.paths.build / "events.jsonl")
        # (rule, declared code...) -> its code files, per invocation
        self._rule_files: dict[tuple[str, ...], list[Path]] = {}

    # -- keys ------------------------------------------------------------------------

    def key_of(self, action: Action) -> ActionKey:
        tc = self.project.toolchains[action.toolchain]
        self._check_pinned(action)
        self.toolchains.check(tc)  # a pin that no longer holds is never "up to date"
        return ActionKey.of(describe(
            stage=action.stage,
            outputs=action.outputs,
            rule=self._rule_digests(action),
            inputs=self._input_digests(action),
            files={name: {"path": path, "digest": self.stats.digest(self.paths.root / path).hex}
                   for name, path in sorted(action.file_params.items())},
            params=action.params,
            source=action.source,
            toolchain=self.toolchains.identity(tc),
            env=tc.env,
            gpu=action.limits.gpu,
        ))

    def _check_pinned(self, action: Action) -> None:
        """The source stage must be fixed-output: a commit and a digest for every file."""
        src = self.project.models[action.model].source
        if action.source is None or src.pinned:
            return
        model = self.project.models[action.model]
        locked = model.variant_of or model.name  # a variant uses its base model's lock
        if src.path is not None:
            raise SpecError(model.file, "source.files",
                            f"every file's sha256 for the folder {src.path}; run "
                            f"`doit lock:{locked}` to write them to its lock")
        raise SpecError(model.file, "source.revision",
                        f"a 40-hex commit with file digests, got {src.revision!r} (a branch?); "
                        f"run `doit lock:{locked}` where the hub is reachable to pin it")

    def _rule_digests(self, action: Action) -> dict[str, str]:
        files = self._rule_paths(action)
        if not files:
            raise StageError(f"{action.task}: rule program rules/{action.rule} does not exist "
                             f"(the {action.target} pipeline expects it)")
        return {p.relative_to(self.paths.rules).as_posix(): self.stats.digest(p).hex
                for p in files}

    def _input_digests(self, action: Action) -> dict[str, str]:
        digests = {}
        for up in action.upstream:
            manifest = read_json(self.paths.root / f"build/{action.model}/{up}" / MANIFEST)
            if manifest is None:
                raise StageError(f"{action.task}: upstream {up}:{action.model} has no result in "
                                 f"build/ (run it first)")
            for rel in sorted(manifest["outputs"]):
                path = self.paths.root / f"build/{action.model}/{up}" / rel
                try:
                    digests[f"{up}/{rel}"] = self.stats.digest(path).hex
                except OSError as exc:
                    raise StageError(f"{action.task}: upstream output build/{action.model}/{up}/"
                                     f"{rel} is missing ({exc.strerror}); run {up}:"
                                     f"{action.model} again") from exc
        return digests

    # -- deciding --------------------------------------------------------------------

    def decide(self, action: Action) -> Decision:
        key = self.key_of(action)
        manifest = read_json(self._stage_dir(action) / MANIFEST)
        if manifest is not None and manifest.get("key") == key.hex:
            broken = self._first_changed_output(action, manifest)
            if broken is None:
                return Decision(Outcome.UPTODATE, "outputs in build/ match the current key", key)
            reason = f"{broken} in build/ was changed or removed"
        elif manifest is None:
            reason = "no result in build/"
        else:
            reason = "inputs, parameters, rule or toolchain changed since the last build"
        if self.store.has_record(key.hex):
            return Decision(Outcome.RESTORED, reason + "; the result is in the store", key)
        return Decision(Outcome.BUILT, reason + "; no stored result for this key", key)

    def _first_changed_output(self, action: Action, manifest: dict[str, Any]) -> str | None:
        for rel, out in sorted(manifest.get("outputs", {}).items()):
            path = self._stage_dir(action) / rel
            try:
                if self.stats.digest(path).hex != out["digest"]:
                    return rel
            except OSError:
                return rel
        return None

    def is_uptodate(self, task: str) -> bool:
        """doit's question, answered from the last verdict while nothing it read changed."""
        action = self.actions[task]
        if self.fast.still_uptodate(task, self._stamp(action)) is not None:
            return True
        try:
            paths = self._depends_on(action)
            decision = self.decide(action)
        except HefbuildError:
            return False  # let the action run and report the error in its own words
        if decision.outcome is Outcome.UPTODATE:
            self._keep_verdict(action, decision.key, paths)
        return decision.outcome is Outcome.UPTODATE

    # -- the fast path ---------------------------------------------------------------

    def _stamp(self, action: Action) -> str:
        return self.fast.stamp(action.toolchain)

    def _depends_on(self, action: Action) -> tuple[int, ...]:
        """Every file a decision about `action` reads (as fast-path indexes); stat-ed now,
        before the decision reads them, so a change in between shows next time."""
        root = self.paths.root
        paths = [p.relative_to(root).as_posix() for p in self._rule_paths(action)]
        paths += sorted(action.file_params.values())
        for up in action.upstream:
            paths += _manifest_and_outputs(root, f"build/{action.model}/{up}")
        indexes = self.fast.indexes(paths)
        own = self.fast.indexes(_manifest_and_outputs(root, action.out_dir))
        self.fast.fingerprint("", indexes + own)  # stat each once, now
        return indexes

    def _keep_verdict(self, action: Action, key: ActionKey, inputs: tuple[int, ...]) -> None:
        """After a decision or a run: the files it read (stat-ed before) and its outputs,
        as they are now in build/."""
        own = self.fast.indexes(_manifest_and_outputs(self.paths.root, action.out_dir))
        paths = inputs + own
        stamp = self._stamp(action)
        note = check_verdict(self.paths.root, action.task, checks=self.checks)
        self.fast.record(action.task, Verdict(self.fast.fingerprint(stamp, paths), key.hex,
                                              paths, note))

    def _rule_paths(self, action: Action) -> list[Path]:
        code = (action.rule, *action.code)
        if code not in self._rule_files:
            self._rule_files[code] = rule_code_files(self.paths.rules, action.rule, action.code)
        return self._rule_files[code]

    # -- doing -----------------------------------------------------------------------

    def run(self, task: str, force: bool = False) -> dict[str, Any]:
        """Leave, restore or build one task; `force` builds it again whatever is stored."""
        action = self.actions[task]
        start = time.monotonic()
        key: ActionKey | None = None
        try:
            try:
                inputs = self._depends_on(action)
                decision = self.decide(action)
                key = decision.key
                outcome, record, extra = self._realize(action, decision, force, start)
                self._keep_verdict(action, key, inputs)
            except OSError as exc:
                raise disk_error(task, exc, self.paths.store) from exc
        except SpecError:
            raise  # bad input changes nothing, not even the event log
        except BaseException as exc:
            self.fast.drop(task)
            peak = getattr(exc, "peak_rss_mb", None) or peak_rss_mb()  # the rule's, if it ran
            self.events.append(task, key.hex if key else None, Outcome.FAILED,
                               time.monotonic() - start, peak, error=one_line(exc))
            raise
        peak = record.peak_rss_mb if record and outcome is Outcome.BUILT else peak_rss_mb()
        seconds = time.monotonic() - start
        measured = self._record_duration(action, record) if outcome is Outcome.BUILT else {}
        if outcome is not Outcome.UPTODATE:
            measured.update(check_figures(self.paths.root, task, self.checks))
        self.events.append(task, key.hex, outcome, seconds, peak, **extra, **measured)
        shown = {"seconds": round(seconds, 3)}
        if outcome is Outcome.BUILT and peak:
            shown["peak_rss_mb"] = round(peak)  # the rule's own peak, for the task's line
        return {"outcome": outcome.value, "key": key.hex, **shown, **extra}

    def _realize(self, action: Action, decision: Decision, force: bool,
                 start: float) -> tuple[Outcome, Record | None, dict[str, Any]]:
        """Leave build/ as it is, or put a restored, fetched or built record in it.

        Each result is verified (or stored) and linked into build/ inside one shared window
        of the store lock, so `doit gc` never sees it unpinned in between.
        """
        key = decision.key
        if decision.outcome is Outcome.UPTODATE and not force:
            return Outcome.UPTODATE, None, {}
        if decision.outcome is Outcome.RESTORED and not force:
            with self.store_lock.shared():
                record = self._local(action, key)
                if record is not None:
                    return self._install(action, key, Outcome.RESTORED, record, {}, start)
        with self.store.building(key.hex, lambda: self._say_waiting(action, key)):
            if not force:
                with self.store_lock.shared():
                    found = self._local(action, key)
                    if found is not None:  # another process built it while we waited
                        return self._install(action, key, Outcome.RESTORED, found, {}, start)
                    fetched = self._fetch(action, key)
                    if fetched is not None:
                        return self._install(action, key, Outcome.REMOTE, *fetched, start)
            record, extra = self._build(action, key, start)
        self._upload(record)
        return Outcome.BUILT, record, extra

    def _install(self, action: Action, key: ActionKey, outcome: Outcome, record: Record,
                 extra: dict[str, Any], start: float,
                 ) -> tuple[Outcome, Record, dict[str, Any]]:
        self._register()
        manifest = _manifest(action, key, record, outcome, time.monotonic() - start)
        if "ran_on" in extra:
            manifest["ran_on"] = extra["ran_on"]  # the cluster node that built it
        self._materialize(action, record, manifest)
        self.store.touch(key.hex)
        return outcome, record, extra

    def _local(self, action: Action, key: ActionKey) -> Record | None:
        """The store's result for `key`, checked as a remote one is before anything of it
        reaches build/: its outputs are the declared ones, at safe paths, all intact."""
        record = self.store.get_record(key.hex)
        if record is None:
            return None
        if fits_declared(record, action.outputs) and self.store.intact(record):
            return record
        self.store.drop_record(key.hex)  # corrupt or not this stage's: a miss, rebuilt
        return None

    def _fetch(self, action: Action, key: ActionKey) -> tuple[Record, dict[str, Any]] | None:
        """The remote cache's verified result, now in the local store; None on a miss."""
        remote = self.remote
        if remote is None:
            return None
        fetched = remote.fetch(key.hex, self.store, action.task, action.outputs)
        if fetched is None:
            return None
        return fetched.record, {"bytes": fetched.bytes,
                                "remote_seconds": round(fetched.seconds, 3)}

    def _upload(self, record: Record) -> None:
        """After the result is linked in build/ (so pinned against gc), share it."""
        remote = self.remote
        if remote is not None and remote.uploading:
            remote.upload(record, self.store)

    def _queue_upload(self, action: Action, key: ActionKey) -> None:
        """Before a result is recorded: a `kill -9` before its upload leaves it queued."""
        cache = self.project.settings.cache
        if cache.remote is not None and cache.upload:
            UploadQueue(self.store.root, cache.remote).add(key.hex, action.task)

    def flush_uploads(self) -> int:
        """Upload what earlier runs stored but did not send (killed, or the cache was
        down); the number of results sent. A no-op costs one folder listing."""
        cache = self.project.settings.cache
        if cache.remote is None or not cache.upload:
            return 0
        queue = UploadQueue(self.store.root, cache.remote)
        pending = queue.pending()
        remote = self.remote if pending else None
        sent = 0
        for key in pending:
            if remote is None or not remote.uploading:
                break
            record = self.store.get_record(key)
            if record is None or not self.store.present(record):
                queue.done(key)  # collected since: nothing to send
                continue
            with self.store_lock.shared():
                sent += remote.upload(record, self.store) is not None
        return sent

    @property
    def remote(self) -> RemoteCache | None:
        if self._remote is False:
            cache = self.project.settings.cache
            if cache.remote is None:
                self._remote = None
            else:
                from ..remote.cache import RemoteCache  # sockets and crypto only when used

                self._remote = RemoteCache(cache, self.warn)
        return self._remote or None

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        if self.progress is not None:
            self.progress(f"[hefbuild] WARNING: {message}")

    def _say_waiting(self, action: Action, key: ActionKey) -> None:
        if self.progress is not None:
            self.progress(f"[hefbuild] {action.task}: another process is building key "
                          f"{key.hex[:12]}…; waiting to restore its result")

    def _build(self, action: Action, key: ActionKey,
               start: float) -> tuple[Record, dict[str, Any]]:
        tc = self.project.toolchains[action.toolchain]
        self.toolchains.check(tc)
        self._sweep_once()
        running = self._stage_dir(action).parent / f"{action.stage}.running.log"
        running.parent.mkdir(parents=True, exist_ok=True)
        running.unlink(missing_ok=True)
        if self.progress is not None:
            self.progress(f"[hefbuild] {action.task}: building (rules/{action.rule}, toolchain "
                          f"{action.toolchain}); log: {running.relative_to(self.paths.root)}")
        python = self._interpreter(action, tc, running)
        with self.store.scratch() as scratch:
            stage = replace(self._stage_run(action, key, scratch, python), log_file=running)
            try:
                with self._follow(running):
                    result = self._executor(tc.kind).run_stage(stage)
            except BaseException:
                self._keep_failed_log(action, running)
                raise
            if result.returncode != 0 or result.killed_for:
                message = failure_message(action, stage, result, self.store.root)
                self._keep_failed_run(action, running, stage.out)
                raise RuleFailed(message, peak_rss_mb=result.peak_rss_mb)
            try:
                outputs = self._collect_outputs(action, stage.out)
            except MissingOutput:
                self._keep_failed_run(action, running, stage.out)
                raise
            bound_log(running, scratch / LOG, log_limit())
            extra = {"node": result.node["name"], "ran_on": result.node} if result.node else {}
            with self.store_lock.shared():
                record = self._store_result(action, key, result, outputs, scratch / LOG,
                                            "docker" if stage.image else result.isolation)
                self._install(action, key, Outcome.BUILT, record, extra, start)
            running.unlink(missing_ok=True)
        return record, {k: v for k, v in extra.items() if k == "node"}

    def _follow(self, running: Path) -> AbstractContextManager[Any]:
        """`doit -v 2` streams the rule's output as it runs (doit shows nothing of it)."""
        if not self.stream_logs or self.progress is None:
            return nullcontext()
        from ..execute.watch import OWN_PREFIX

        return LogFollower(running, self.progress, OWN_PREFIX)

    def _sweep_once(self) -> None:
        """What killed runs left: scratch folders in the store, staging folders in build/."""
        if not self._swept:
            self._swept = True
            self.store.sweep_stale()
            sweep_staging(self.paths.build)

    def _store_result(self, action: Action, key: ActionKey, result: ExecResult,
                      outputs: dict[str, Path], log_path: Path, isolation: str) -> Record:
        stored = {rel: self.store.put_file(path) for rel, path in outputs.items()}
        log = self.store.put_file(log_path)
        self._queue_upload(action, key)
        record = Record(key.hex, action.stage, stored, log.digest,
                        key.description["toolchain"], round(result.seconds, 3),
                        round(result.peak_rss_mb, 1), key.description,
                        round(result.cpu_seconds, 2), round(time.time(), 3), isolation)
        self.store.put_record(record)
        return record

    def _register(self) -> None:
        """Once per invocation that puts anything in build/ (never on a no-op): the project
        is known to `doit gc`, and the digest table is pruned (at most once a day)."""
        if not self._registered:
            register_project(self.store.root, self.paths.root)
            self.stats.prune()
            self._registered = True

    def _interpreter(self, action: Action, tc: ToolchainSpec, running: Path) -> str:
        """The python of the stage's rule; a venv toolchain's environment is created on its
        first use (minutes), said on the terminal and in the stage's log."""
        if tc.kind != "venv":
            return interpreter_path(tc)

        def say(message: str) -> None:
            with open(running, "a") as log:
                log.write(f"[hefbuild] {message}\n")
            if self.progress is not None:
                self.progress(f"[hefbuild] {action.task}: {message}")

        return self.toolchains.venv_python(tc, self.store.root / "venvs", say)

    def _stage_run(self, action: Action, key: ActionKey, scratch: Path,
                   python: str) -> StageRun:
        from ..execute import StageRun
        from ..plan.limits import device_target, stage_limits
        for sub in ("out", "work"):
            (scratch / sub).mkdir()
        tc = self.project.toolchains[action.toolchain]
        rule_action = {"model": action.model, "stage": action.stage, "target": action.target,
                       "params": action.params, "source": action.source,
                       "outputs": list(action.outputs)}
        if tc.device:
            rule_action["device"] = device_target(tc)
        network = action.source is not None  # the source stage only
        return StageRun(
            sandbox=self._sandboxed(tc), network=network,
            writable=hub_cache_dirs() if network else (),
            task=action.task, interpreter=python, rules_dir=self.paths.rules,
            rule=action.rule, action=rule_action,
            inputs={up: self.paths.root / f"build/{action.model}/{up}" for up in action.upstream},
            files={**{k: self.paths.root / v for k, v in action.file_params.items()},
                   **self._source_dir(action)},
            scratch=scratch, env=dict(tc.env), limits=stage_limits(action, tc),
            watch=self._watch(action, key),
            image=key.description["toolchain"].get("image_id"),
            digests=self._read_digests(action, key),
            toolchain=action.toolchain, identity=key.description["toolchain"],
        )

    def _read_digests(self, action: Action, key: ActionKey) -> dict[Path, str]:
        """Where each file the key names is, with its digest (a cluster moves them by it)."""
        d = key.description
        found = {self.paths.root / "build" / action.model / rel: digest
                 for rel, digest in d["inputs"].items()}
        found.update({self.paths.root / f["path"]: f["digest"] for f in d["files"].values()})
        found.update({self.paths.rules / rel: digest for rel, digest in d["rule"].items()})
        return found

    def _source_dir(self, action: Action) -> dict[str, Path]:
        """The source stage of a local source reads its folder (read-only in the sandbox); the
        folder is in no key: the files' digests are (moving it changes nothing)."""
        src = self.project.models[action.model].source
        if action.source is None or src.path is None:
            return {}
        return {"source_dir": Path(src.path)}

    def _sandboxed(self, tc: ToolchainSpec) -> bool:
        """Host stages run in bubblewrap unless the project opted out (said once)."""
        if tc.kind not in ("host", "venv"):
            return False  # a container is its own sandbox; a device stage reaches a device
        if not self.project.settings.sandbox and not self._said_unsandboxed:
            self._said_unsandboxed = True
            self.warn("host stages run without a sandbox (sandbox = false in hefbuild.toml "
                      "or HEFBUILD_SANDBOX=0): a rule can read and write anything you can")
        return self.project.settings.sandbox

    def _watch(self, action: Action, key: ActionKey) -> Watch:
        from ..execute import Watch
        def emit(beat: dict[str, Any]) -> None:
            self.events.heartbeat(action.task, key.hex, beat)
            if self.progress is not None:
                self.progress(f"[hefbuild] {action.task}: {beat['message']}")

        # Read only here, when a stage is about to build: never on a no-op or `doit list`.
        from ..store import history

        fields = _history_fields(self.paths.root, action, key.description)
        usual = history.usual(history.read_durations(self.store.root), action.stage, **fields)
        return Watch(_env_seconds("HEFBUILD_HEARTBEAT_S", 60.0),
                     _env_seconds("HEFBUILD_SILENCE_S", 900.0), emit,
                     usual_s=usual.seconds if usual else None,
                     usual_builds=usual.builds if usual else 0,
                     phases=self._phase_table(action.target))

    def _phase_table(self, target: str) -> PhaseTable | None:
        """The target's declared phase table (loaded once, when a first stage builds)."""
        if self._targets is None:
            from ..declare.targets import load_targets
            self._targets = load_targets(self.paths.root)
        spec = self._targets.get(target)
        return spec.phases if spec is not None else None

    def _record_duration(self, action: Action, record: Record) -> dict[str, Any]:
        """A built stage's run time joins the store's history (the next build's ETA);
        returns the fields that make it comparable, for the `built` event too."""
        from ..store import history

        fields = _history_fields(self.paths.root, action, record.description)
        history.record_duration(self.store.root, action.task, record.key, record.seconds,
                                record.peak_rss_mb, **fields)
        return fields

    def _executor(self, kind: str) -> Executor:
        local = self._local_executor(kind)
        if self.project.settings.executor.kind != "ray":
            return local
        if f"ray-{kind}" not in self._executors:
            from ..execute.ray import RayCluster, RayExecutor  # ray only when configured

            if self._cluster is None:
                executor = self.project.settings.executor
                self._cluster = RayCluster(executor.address, executor.node_types)
            self._executors[f"ray-{kind}"] = RayExecutor(
                self._cluster, kind, local, self.project.settings, self.store, self.warn)
        return self._executors[f"ray-{kind}"]

    def _local_executor(self, kind: str) -> Executor:
        if kind in ("host", "ssh", "local", "venv") and kind not in self._executors:
            from ..execute import HostExecutor  # a device stage's rule runs here too

            host = self._executors.get("host") or HostExecutor()
            self._executors.update({"host": host, "ssh": host, "local": host, "venv": host})
        if kind not in self._executors:
            from ..execute.docker import DockerExecutor  # the docker SDK only when needed

            self._executors[kind] = DockerExecutor()
        return self._executors[kind]

    def _collect_outputs(self, action: Action, out: Path) -> dict[str, Path]:
        return collect_outputs(f"{action.task}: rules/{action.rule}", action.outputs, out)

    def _keep_failed_log(self, action: Action, running: Path) -> None:
        """The whole log of the failed run, where a person looks (same disk: a rename)."""
        dest = self._stage_dir(action).parent / f"{action.stage}.failed.log"
        with suppress(OSError):
            os.replace(running, dest)

    def _keep_failed_run(self, action: Action, running: Path, out: Path) -> None:
        """A rule that failed: its log and the small declared outputs it wrote (a failed
        verify's report) go next to each other in build/, and the previous result leaves
        build/ (it was made for other inputs; the store keeps it for a way back)."""
        self._keep_failed_log(action, running)
        with suppress(OSError):
            keep_failed_outputs(action.outputs, out,
                                self._stage_dir(action).parent / f"{action.stage}.failed")
        shutil.rmtree(self._stage_dir(action), ignore_errors=True)
        self.fast.forget(action.out_dir)

    # -- build/ ----------------------------------------------------------------------

    def _stage_dir(self, action: Action) -> Path:
        return self.paths.root / action.out_dir

    def _materialize(self, action: Action, record: Record, manifest: dict[str, Any]) -> None:
        """Replace build/<model>/<stage>/ as a whole: a crash leaves the old or the new."""
        final = self._stage_dir(action)
        for stale in final.parent.glob(f".{action.stage}.*-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed run; we hold the lock
        staging = final.parent / f".{action.stage}.new-{os.getpid()}"
        for rel, out in record.outputs.items():
            self.store.materialize(out.digest, staging / rel)
        # A copy, not a link: an edit of build/'s log must not reach the store and the
        # other projects (logs are bounded, so a copy is cheap).
        self.store.copy_out(record.log, staging / LOG)
        (staging / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, indent=1))
        _swap_dir(staging, final)
        self.fast.forget(action.out_dir)
        (final.parent / f"{action.stage}.failed.log").unlink(missing_ok=True)
        shutil.rmtree(final.parent / f"{action.stage}.failed", ignore_errors=True)


def _manifest(action: Action, key: ActionKey, record: Record, outcome: Outcome,
              seconds: float) -> dict[str, Any]:
    return {
        "task": action.task, "model": action.model, "key": key.hex,
        "outcome": outcome.value, "seconds": round(seconds, 3),
        "build_seconds": record.seconds, "peak_rss_mb": record.peak_rss_mb,
        "cpu_seconds": record.cpu_seconds, "sandbox": record.sandbox or "none",
        "outputs": {rel: {"digest": o.digest, "size": o.size}
                    for rel, o in sorted(record.outputs.items())},
        "description": key.description,
    }


def _history_fields(root: Path, action: Action, description: dict[str, Any]) -> dict[str, Any]:
    """What makes two builds of a stage comparable (hefbuild.history): a fingerprint of the
    rule's code and the bytes the stage reads (upstream outputs and file parameters)."""
    from ..store.history import rule_fingerprint

    paths = [root / "build" / action.model / rel for rel in description.get("inputs", {})]
    paths += [root / f["path"] for f in description.get("files", {}).values()]
    size = 0
    for path in paths:
        with suppress(OSError):
            size += path.stat().st_size
    return {"rule": rule_fingerprint(description.get("rule", {})), "input_bytes": size}


def hub_cache_dirs() -> tuple[Path, ...]:
    """Where fetch keeps Hugging Face downloads (writable in its sandbox), created now."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    dirs = [home]
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return tuple(dirs)


def _manifest_and_outputs(root: Path, stage_dir: str) -> list[str]:
    manifest = read_json(root / stage_dir / MANIFEST)
    outputs = sorted(manifest.get("outputs", {})) if manifest else []
    return [f"{stage_dir}/{MANIFEST}"] + [f"{stage_dir}/{rel}" for rel in outputs]


def _swap_dir(new: Path, final: Path) -> None:
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(new, final)
    shutil.rmtree(old, ignore_errors=True)


def _env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default
