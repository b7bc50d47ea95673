"""Building a stage: its toolchain checked, its rule run by an executor in a scratch folder
of the store under a watch, its declared outputs collected and stored, its result recorded
(queued for upload first) and installed into build/. A failed run leaves its log and small
outputs next to the stage in build/ and nothing in the store."""

from __future__ import annotations

import os
import shutil
import time
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..declare.toolchains import ToolchainSpec
from ..errors import MissingOutput, RuleFailed
from ..execute.stagelog import LogFollower, bound_log, keep_failed_outputs, log_limit
from ..plan.actions import Action
from ..plan.key import ActionKey
from ..store.events import Outcome
from ..store.store import Record, sweep_staging
from .collect import collect_outputs
from .context import Context
from .envs import Environments
from .executors import ExecutorChoice
from .failures import failure_message
from .install import LOG, Installer
from .share import RemoteTier
from .stagerun import StageRunMaker

if TYPE_CHECKING:
    from ..execute import ExecResult, StageRun


class Builder:
    def __init__(self, ctx: Context, executors: ExecutorChoice, installer: Installer,
                 remote: RemoteTier) -> None:
        self.ctx, self.executors, self.installer, self.remote = ctx, executors, installer, remote
        self.stage_runs = StageRunMaker(ctx)
        self.envs = Environments(ctx)
        self._swept = False

    def build(self, action: Action, key: ActionKey,
              start: float) -> tuple[Record, dict[str, Any]]:
        ctx = self.ctx
        tc = ctx.project.toolchains[action.toolchain]
        ctx.toolchains.check(tc)
        self._sweep_once()
        running = self._stage_dir(action).parent / f"{action.stage}.running.log"
        running.parent.mkdir(parents=True, exist_ok=True)
        running.unlink(missing_ok=True)
        ctx.say(f"[hefbuild] {action.task}: building (rules/{action.rule}, toolchain "
                f"{action.toolchain}); log: {running.relative_to(ctx.paths.root)}")
        with self.envs.python(action, tc, key, running) as python, \
                ctx.store.scratch() as scratch:
            start += ctx.env_wait(action.task)  # the stage's clock starts now
            stage = replace(self.stage_runs.make(action, key, scratch, python), log_file=running)
            result = self._run(action, tc, stage, running)
            outputs = self._outputs(action, stage.out, running)
            bound_log(running, scratch / LOG, log_limit())
            extra = {"node": result.node["name"], "ran_on": result.node} if result.node else {}
            with ctx.store_lock.shared():
                record = self._store_result(action, key, result, outputs, scratch / LOG,
                                            "docker" if stage.image else result.isolation)
                self.installer.install(action, key, Outcome.BUILT, record, extra, start)
            running.unlink(missing_ok=True)
        return record, {k: v for k, v in extra.items() if k == "node"}

    def _run(self, action: Action, tc: ToolchainSpec, stage: StageRun,
             running: Path) -> ExecResult:
        try:
            with self._follow(running):
                result = self.executors.for_kind(tc.kind).run_stage(stage)
        except BaseException:
            self._keep_failed_log(action, running)
            raise
        if result.returncode != 0 or result.killed_for:
            message = failure_message(action, stage, result, self.ctx.store.root)
            self._keep_failed_run(action, running, stage.out)
            raise RuleFailed(message, peak_rss_mb=result.peak_rss_mb)
        return result

    def _outputs(self, action: Action, out: Path, running: Path) -> dict[str, Path]:
        try:
            return collect_outputs(f"{action.task}: rules/{action.rule}", action.outputs, out)
        except MissingOutput:
            self._keep_failed_run(action, running, out)
            raise

    def _store_result(self, action: Action, key: ActionKey, result: ExecResult,
                      outputs: dict[str, Path], log_path: Path, isolation: str) -> Record:
        store = self.ctx.store
        stored = {rel: store.put_file(path) for rel, path in outputs.items()}
        log = store.put_file(log_path)
        self.remote.queue(action, key)
        record = Record(key.hex, action.stage, stored, log.digest,
                        key.description["toolchain"], round(result.seconds, 3),
                        round(result.peak_rss_mb, 1), key.description,
                        round(result.cpu_seconds, 2), round(time.time(), 3), isolation)
        store.put_record(record)
        return record

    def _follow(self, running: Path) -> AbstractContextManager[Any]:
        """`doit -v 2` streams the rule's output as it runs (doit shows nothing of it)."""
        if not self.ctx.stream_logs or self.ctx.progress is None:
            return nullcontext()
        from ..execute.watch import OWN_PREFIX

        return LogFollower(running, self.ctx.progress, OWN_PREFIX)

    def _sweep_once(self) -> None:
        """What killed runs left: scratch folders in the store, staging folders in build/."""
        if not self._swept:
            self._swept = True
            self.ctx.store.sweep_stale()
            sweep_staging(self.ctx.paths.build)

    def _stage_dir(self, action: Action) -> Path:
        return self.ctx.paths.root / action.out_dir

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
        self.ctx.fast.forget(action.out_dir)
