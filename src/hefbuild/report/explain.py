"""Why a task would run: the difference between its last build and now, field by field.

One verdict per task (`status_of`) serves `doit explain` and `doit status`, so the two never
disagree, and `explain`'s headline and detail are both said from it; it is what the engine
itself decides (`Engine.decide`), taken upstream first: a task whose upstream would run
cannot be judged until that upstream's outputs exist. A task whose last run failed, for the
key it has now, is `failed`, with that run's error (its `failed` event) and log.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..engine.engine import MANIFEST, Engine
from ..engine.lazy import in_remote
from ..errors import HefbuildError
from ..plan.key import diff_descriptions
from ..store.events import Outcome, read_events, read_json
from .checks import EMULATION

# What a build would do to a task: leave it, restore it, build it, or decide after upstream.
UPTODATE, RESTORE, BUILD, NEVER, AFTER, REFUSED, FAILED = (
    "up to date", "would restore", "would build", "never built", "after upstream", "refused",
    "failed")
# What `doit explain` says first of a task that would run, by its kind.
_WOULD = {RESTORE: "would be restored from the store", BUILD: "would build",
          NEVER: "would build", FAILED: "would build again"}

REFUSED_UPSTREAM = "it is refused:"


@dataclass(frozen=True)
class TaskStatus:
    task: str
    kind: str  # one of the constants above
    reason: str  # the first reason, one line
    changes: tuple[str, ...] = ()  # `path: old -> new` since the last build in build/
    key: str = ""
    upstream: str = ""  # for AFTER: the earliest upstream task that would run
    decided: str = ""  # the engine's own words (what `doit explain` says first)
    in_remote: tuple[str, ...] = ()  # up to date, these files in the remote cache only

    @property
    def will_run(self) -> bool:
        return self.kind in (BUILD, NEVER, FAILED)


def status_of(engine: Engine, task: str) -> TaskStatus:
    action = engine.actions[task]
    try:
        blocked = _first_stale_upstream(engine, task)
        if blocked is not None:
            up, why = blocked
            return TaskStatus(task, AFTER, why, upstream=up)
        decision = engine.decide(action)
    except HefbuildError as exc:
        return TaskStatus(task, REFUSED, str(exc))
    key = decision.key.hex
    if decision.outcome is Outcome.UPTODATE:
        return TaskStatus(task, UPTODATE, "", key=key,
                          in_remote=tuple(in_remote(engine.paths.root, action.out_dir)))
    manifest = read_json(engine.paths.root / action.out_dir / MANIFEST)
    changes: tuple[str, ...] = ()
    if manifest is not None and "description" in manifest:
        changes = tuple(diff_descriptions(manifest["description"], decision.key.description))
    reason = decision.reason.split(";")[0]
    if decision.outcome is Outcome.RESTORED:
        return TaskStatus(task, RESTORE, reason, changes, key, decided=reason)
    failure = last_failure(engine.paths.root, action.model, action.stage, key)
    if failure:
        return TaskStatus(task, FAILED, failure, changes, key, decided=reason)
    kind = BUILD if manifest is not None else NEVER
    return TaskStatus(task, kind, changes[0] if changes else reason, changes, key,
                      decided=reason)


def explain_task(engine: Engine, task: str) -> list[str]:
    status = status_of(engine, task)
    action = engine.actions[task]
    if status.kind == AFTER and status.reason.startswith(REFUSED_UPSTREAM):
        return [f"{task}: would fail: upstream {status.upstream} "
                f"{status.reason[len('it '):]}"]
    if status.kind == AFTER:
        return [f"{task}: decided after upstream {status.upstream}, which runs first "
                f"({status.reason})",
                f"  its inputs are {status.upstream}'s outputs; if they come out "
                f"byte-identical, {task} stays as it is (early cutoff)"]
    if status.kind == REFUSED:
        return [f"{task}: would fail: {status.reason}"]
    if status.kind == UPTODATE:
        return [f"{task}: up to date (key {status.key[:12]})"] + _remote_only(status) + \
            _emulation(engine, task)
    lines = [f"{task}: {_WOULD[status.kind]} ({status.decided})"]
    lines += _last_failure(engine, task)
    if status.kind == FAILED:
        lines.append(f"  its error: {status.reason.split('; log: ')[0]}")
    lines += [f"  changed since the last build: {c}" for c in status.changes]
    if status.kind == RESTORE:
        lines.append(f"  the result for key {status.key[:12]} is in the store: it would be "
                     f"restored, no rule run")
    else:
        lines.append(f"  no stored result for key {status.key[:12]}: rules/{action.rule} "
                     f"would run")
    return lines


def _remote_only(status: TaskStatus) -> list[str]:
    if not status.in_remote:
        return []
    return [f"  in the remote cache, not in build/: {', '.join(status.in_remote)} "
            f"(`doit fetch {status.task}` brings them)"]


def last_failure(root: Path, model: str, stage: str, key: str) -> str:
    """The one line a failed run of this key left (`<error>; log: <path>`), while its log is
    in build/ and no later run of the task followed; empty otherwise."""
    log = root / "build" / model / f"{stage}.failed.log"
    if not log.is_file():
        return ""
    events = root / "build" / "events.jsonl"
    try:
        stat = events.stat()
    except OSError:
        return ""
    last = _last_events(events, stat.st_size, stat.st_mtime_ns).get(f"{stage}:{model}")
    if not last or last.get("outcome") != Outcome.FAILED.value or last.get("key") != key:
        return ""
    error = str(last.get("error", "")).removeprefix(f"{stage}:{model}: ")
    where = f"build/{model}/{log.name}"
    return error if error.endswith(f"; log: {where}") else f"{error}; log: {where}"


@lru_cache(maxsize=1)
def _last_events(path: Path, size: int, mtime_ns: int) -> dict[str, dict[str, Any]]:
    """task -> its last event line, read once per state of the log (`doit status` asks for
    every task, and the log may be megabytes)."""
    events, _damaged = read_events(path)
    return {e["task"]: e for e in events if "task" in e and "outcome" in e}


def running_log(engine: Engine, task: str) -> Path | None:
    """The log a stage streams to while it runs, when it is running (or was killed)."""
    action = engine.actions[task]
    path = engine.paths.root / "build" / action.model / f"{action.stage}.running.log"
    return path if path.is_file() else None


def _first_stale_upstream(engine: Engine, task: str) -> tuple[str, str] | None:
    """The earliest upstream task that is not up to date, with its reason."""
    action = engine.actions[task]
    for up in action.upstream:  # not `after`: ordering only, never part of the key
        up_task = f"{up}:{action.model}"
        deeper = _first_stale_upstream(engine, up_task)
        if deeper is not None:
            return deeper
        try:
            decision = engine.decide(engine.actions[up_task])
        except HefbuildError as exc:
            return up_task, f"{REFUSED_UPSTREAM} {exc}"
        if decision.outcome is not Outcome.UPTODATE:
            return up_task, decision.reason.split(";")[0]
    return None


def _emulation(engine: Engine, task: str) -> list[str]:
    """A stage whose report is an emulation says so, what it leaves out, and the recipe
    change it proposes: a person reads this before spending the hours of a compile."""
    action = engine.actions[task]
    folder = engine.paths.root / "build" / action.model / action.stage
    for name in action.outputs:
        report = read_json(folder / name) if name.endswith(".json") else None
        if not report or report.get("kind") != EMULATION:
            continue
        lines = [f"  build/{action.model}/{action.stage}/{name} is an estimate, not the chip: "
                 f"{report.get('note', '')}"]
        lines += [f"  not modelled: {item}" for item in report.get("not_emulated") or []]
        proposal = report.get("proposal") or {}
        best = proposal.get("proposed") or {}
        if proposal.get("needed") and proposal.get("all_a16_reaches") is False:
            figure = (best.get("summary") or {}).get("worst_teacher_forced")
            lines.append(f"  no recipe change reaches the target in emulation: even every "
                         f"layer at a16_w16 gives worst teacher-forced {figure}")
        elif proposal.get("needed") and best.get("lines"):
            reach = "reaches" if proposal.get("reached") else "does NOT reach"
            lines.append(f"  proposed recipe change ({reach} the target in emulation), to "
                         f"append to the model's recipe:")
            lines += [f"    {line}" for line in best["lines"]]
        return lines
    return []


def _last_failure(engine: Engine, task: str) -> list[str]:
    """Where the last failed run of a task left its log and the outputs it wrote."""
    action = engine.actions[task]
    folder = engine.paths.root / "build" / action.model
    log = folder / f"{action.stage}.failed.log"
    if not log.is_file():
        return []
    line = f"  its last run failed: build/{action.model}/{log.name}"
    kept = folder / f"{action.stage}.failed"
    if kept.is_dir():
        names = sorted(p.relative_to(folder).as_posix() for p in kept.rglob("*") if p.is_file())
        line += "; what it wrote: " + ", ".join(f"build/{action.model}/{n}" for n in names)
    return [line]
