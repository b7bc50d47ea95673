"""The rebuilder: for one action, decide (its key, and why it would run), then leave it,
or find its result (local store, then remote), or build it; install the result into
build/ and record what happened. doit is the scheduler above: it orders the tasks and asks
`is_uptodate` and `run` of each.

    run(task) = decide → [find | build] → install → record

Deciding reads state and writes nothing; only `run` writes the store, `build/` and the
event log. Each step is a small object in this package; `Engine` wires them for one
invocation and keeps the public surface the adapter and the tests use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..declare.checks import checks_of
from ..declare.project import Project
from ..errors import HefbuildError, SpecError
from ..execute.toolchain import ToolchainResolver
from ..plan.actions import Action, plan_project
from ..plan.key import ActionKey
from ..store.events import EventLog, Outcome
from ..store.statcache import StatCache
from ..store.store import STORE_FORMAT, Record, Store
from ..store.storelock import StoreLock
from .build import Builder
from .context import Context
from .decide import Decider, Decision
from .executors import ExecutorChoice
from .failures import disk_error
from .fastpath import FastPath, fast_path_of
from .find import Finder
from .install import Installer
from .keys import MANIFEST, KeyMaker
from .lazy import Lazy
from .memo import VerdictMemo
from .record import Recorder
from .share import RemoteTier

if TYPE_CHECKING:
    from ..execute import Executor
    from ..remote.cache import RemoteCache

__all__ = ["MANIFEST", "Decision", "Engine"]


class Engine:
    def __init__(self, project: Project, executor: Executor | None = None,
                 progress: Callable[[str], None] | None = None,
                 actions: dict[str, Action] | None = None,
                 fast: FastPath | None = None) -> None:
        paths = project.paths
        stats = StatCache(paths.store / STORE_FORMAT / "digests.sqlite3")
        store = Store(paths.store, stats)
        self.ctx = Context(
            project, paths, stats, store, StoreLock(store.root),
            ToolchainResolver(paths.state / "toolchains.json", paths.toolchains),
            fast or fast_path_of(project), EventLog(paths.build / "events.jsonl"),
            checks_of({m.target: m.pipeline for m in project.models.values()}.values()),
            progress)
        self.actions = actions if actions is not None else plan_project(project)
        self.keys = KeyMaker(self.ctx)
        self.decider = Decider(self.ctx, self.keys)
        self.memo = VerdictMemo(self.ctx, self.keys)
        self.tier = RemoteTier(self.ctx)
        self.finder = Finder(self.ctx, self.tier)
        self.installer = Installer(self.ctx)
        self.builder = Builder(self.ctx, ExecutorChoice(self.ctx, executor), self.installer,
                               self.tier)
        self.recorder = Recorder(self.ctx)
        self.lazy = Lazy(self.ctx, self.tier)

    # -- what doit asks ----------------------------------------------------------------

    def is_uptodate(self, task: str) -> bool:
        """doit's question, answered from the last verdict while nothing it read changed."""
        action = self.actions[task]
        if self.memo.still_uptodate(action):
            return True
        try:
            inputs = self.memo.depends_on(action)
            decision = self.decide(action)
        except HefbuildError:
            return False  # let the action run and report the error in its own words
        if decision.outcome is Outcome.UPTODATE:
            self.memo.keep(action, decision.key, inputs)
        return decision.outcome is Outcome.UPTODATE

    def run(self, task: str, force: bool = False) -> dict[str, Any]:
        """Leave, restore or build one task; `force` builds it again whatever is stored."""
        action = self.actions[task]
        start = time.monotonic()
        key: ActionKey | None = None
        try:
            try:
                inputs = self.memo.depends_on(action)
                decision = self.decide(action)
                key = decision.key
                outcome, record, extra = self._realize(action, decision, force, start)
                if outcome is not Outcome.UPTODATE:
                    extra = {**extra, "why": _why(decision, force)}
                self.memo.keep(action, key, inputs)
            except OSError as exc:
                raise disk_error(task, exc, self.paths.store) from exc
        except SpecError:
            raise  # bad input changes nothing, not even the event log
        except BaseException as exc:
            self.recorder.failed(task, key, start, exc)
            raise
        return self.recorder.done(action, key, outcome, record, extra, start)

    def _realize(self, action: Action, decision: Decision, force: bool,
                 start: float) -> tuple[Outcome, Record | None, dict[str, Any]]:
        """Leave build/ as it is, or put a restored, fetched or built record in it. Each
        result is verified (or stored) and linked into build/ inside one shared window of
        the store lock, so `doit gc` never sees it unpinned in between."""
        key, install = decision.key, self.installer.install
        if decision.outcome is Outcome.UPTODATE and not force:
            return Outcome.UPTODATE, None, {}
        if decision.outcome is Outcome.RESTORED and not force:
            with self.store_lock.shared():
                record = self.finder.local(action, key)
                if record is not None:
                    return install(action, key, Outcome.RESTORED, record, {}, start)
        with self.store.building(key.hex, lambda: self._say_waiting(action, key)):
            if not force:
                with self.store_lock.shared():
                    found = self.finder.local(action, key)
                    if found is not None:  # another process built it while we waited
                        return install(action, key, Outcome.RESTORED, found, {}, start)
                    found_remote = self._remote_hit(action, key, start)
                    if found_remote is not None:
                        return found_remote
            if not self._inputs_ready(action, key):  # an upstream rebuilt with other bytes
                return self._realize(action, self.decide(action), force, start)
            record, extra = self.builder.build(action, key, start)
        self.tier.upload(record)
        return Outcome.BUILT, record, extra

    def _remote_hit(self, action: Action, key: ActionKey, start: float,
                    ) -> tuple[Outcome, Record, dict[str, Any]] | None:
        lazy = self.lazy.lazy_hit(action)
        fetched = self.finder.remote_hit(action, key, lazy)
        if fetched is None:
            return None
        extra = {"bytes": fetched.bytes, "remote_seconds": round(fetched.seconds, 3)}
        if fetched.lazy:
            return self.installer.install_lazy(action, key, fetched.record, fetched.log_size,
                                               extra, start)
        return self.installer.install(action, key, Outcome.REMOTE, fetched.record, extra,
                                      start)

    def _inputs_ready(self, action: Action, key: ActionKey) -> bool:
        """Before a rule runs, every upstream output it reads is in build/: fetched when the
        remote cache kept its bytes, built here when the cache no longer has them. False
        when that changed the stage's key (a rebuilt upstream came out different)."""
        rebuilt = False
        for up in action.upstream:
            up_action = self.actions[f"{up}:{action.model}"]
            if not self.lazy.materialize(up_action):
                self._build_evicted(up_action)
                rebuilt = True
        return not rebuilt or self.keys.key_of(action).hex == key.hex

    def _build_evicted(self, action: Action) -> None:
        """An upstream result whose bytes the remote cache lost after the decision: built
        here (its own inputs first), recorded and shared as any build; never a failure."""
        self.ctx.warn(f"{action.task}: an output is no longer to be had from the remote "
                      f"cache (evicted, or wrong bytes); building it here")
        start = time.monotonic()
        key = self.keys.key_of(action)
        self._inputs_ready(action, key)
        key = self.keys.key_of(action)
        with self.store.building(key.hex, lambda: self._say_waiting(action, key)):
            record, extra = self.builder.build(action, key, start)
        self.tier.upload(record)
        self.recorder.done(action, key, Outcome.BUILT, record,
                           {**extra, "why": "evicted from the remote cache"}, start)

    def fetch_outputs(self, task: str, names: list[str] | None = None,
                      log: bool = False) -> int:
        """What a person asked for (`doit fetch`, an artifact alias, a keep task) into
        build/: from the remote cache, else built here. The bytes fetched."""
        action = self.actions[task]
        before = self.lazy.moved
        if not self.lazy.materialize(action, names, log):
            self._build_evicted(action)
        return self.lazy.moved - before

    # -- what the commands and the tests ask --------------------------------------------

    def key_of(self, action: Action) -> ActionKey:
        return self.keys.key_of(action)

    def decide(self, action: Action) -> Decision:
        return self.decider.decide(action)

    def flush_uploads(self) -> int:
        return self.tier.flush()

    @property
    def remote(self) -> RemoteCache | None:
        return self.tier.cache

    def warn(self, message: str) -> None:
        self.ctx.warn(message)

    def _say_waiting(self, action: Action, key: ActionKey) -> None:
        self.ctx.say(f"[hefbuild] {action.task}: another process is building key "
                     f"{key.hex[:12]}…; waiting to restore its result")

    # The invocation's state, as attributes (the adapter sets progress and stream_logs).
    project = property(lambda self: self.ctx.project)
    paths = property(lambda self: self.ctx.paths)
    stats = property(lambda self: self.ctx.stats)
    store = property(lambda self: self.ctx.store)
    store_lock = property(lambda self: self.ctx.store_lock)
    toolchains = property(lambda self: self.ctx.toolchains)
    fast = property(lambda self: self.ctx.fast)
    events = property(lambda self: self.ctx.events)
    checks = property(lambda self: self.ctx.checks)
    warnings = property(lambda self: self.ctx.warnings)
    progress = property(lambda self: self.ctx.progress,
                        lambda self, value: setattr(self.ctx, "progress", value))
    stream_logs = property(lambda self: self.ctx.stream_logs,
                           lambda self, value: setattr(self.ctx, "stream_logs", value))


def _why(decision: Decision, force: bool) -> str:
    """Why a task ran, in a few words (its line and its event say it)."""
    if force and decision.outcome is not Outcome.BUILT:
        return "-a: built again"
    return decision.why
