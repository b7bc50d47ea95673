"""What hefbuild plugs into doit besides tasks: the file checker and the reporter (which
also holds the project lock for the whole run)."""

from __future__ import annotations

import os
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from doit.dependency import FileChangedChecker
from doit.exceptions import TaskFailed, UnmetDependency
from doit.reporter import ConsoleReporter

from ..declare.checks import Checks
from ..declare.layout import STATE_DIR
from ..engine.verdicts import check_verdict
from ..errors import HefbuildError
from ..report.summary import events_since, outcome_counts, ran, summary_line
from ..report.table import blocked_line, labelled, members, progress, rows, table_lines, task_line
from ..store.events import EventLog, read_events, rotate
from ..store.projectlock import ProjectLock
from . import gcpause
from .preflight import preflight
from .session import (
    close_engines,
    engine_for,
    fast_path_at,
    processes,
    project_at,
    run_models,
    table_at,
)
from .stagemark import STAGE


class DigestChecker(FileChangedChecker):
    """doit file_dep checker on SHA-256 content, through hefbuild's stat cache.

    doit's MD5 checker trusts an unchanged mtime (missing same-size edits that restore
    it) and re-hashes a touched file on every run until the task runs again; this one
    re-hashes only when (size, mtime, ctime, inode) changed, once.
    """

    root: str = ""

    @classmethod
    def bound_to(cls, root: str) -> type[DigestChecker]:
        return type("DigestChecker", (cls,), {"root": root})

    def _digest(self, path: str) -> str:
        return engine_for(self.root).stats.digest(Path(path)).hex

    def check_modified(self, file_path: str, file_stat: os.stat_result, state: Any) -> bool:
        return state != self._digest(file_path)

    def get_state(self, dep: str, current_state: Any) -> str | None:
        digest = self._digest(dep)
        return None if digest == current_state else digest


class HefbuildReporter(ConsoleReporter):
    """doit's console output, plus: the project lock, `uptodate` events, one-line errors,
    why each stage ran, how far the run is, and its wall time."""

    root: str = ""

    @classmethod
    def bound_to(cls, root: str) -> type[HefbuildReporter]:
        return type("HefbuildReporter", (cls,), {"root": root})

    def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
        # Into a pipe or a file (every CI log) stdout is block-buffered: a finished stage's
        # line would come after later stages' `building` lines (stderr), or at exit.
        for stream in (outstream, sys.stdout, sys.stderr):
            with suppress(AttributeError, ValueError, OSError):
                stream.reconfigure(line_buffering=True)
        super().__init__(outstream, options)
        self._lock = ProjectLock(Path(self.root) / STATE_DIR / "lock")
        self._started = time.monotonic()  # the end line's wall time counts from here

    def initialize(self, tasks: dict, selected_tasks: list) -> None:
        gcpause.pause()  # until a task runs, or the run ends (cli/gcpause.py)
        wait = os.environ.get("HEFBUILD_NO_WAIT", "") in ("", "0")
        try:
            self._lock.acquire(wait, lambda msg: print(msg, file=sys.stderr, flush=True))
        except HefbuildError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            raise SystemExit(3) from None
        rotate(self._events_path())
        self._events_at = _size(self._events_path())
        self._uptodate: list[str] = []
        self._succeeded: set[str] = set()
        self._failed: dict[str, str] = {}
        self._blocked: set[str] = set()
        self._selected = list(selected_tasks or [])
        self._known = list(tasks)
        self._stage_total = self._refuse_missing_toolchains(tasks)
        self._tasks = tasks  # their task_dep, for a parallel run's critical path at the end
        self._shown = 0  # stage lines written so far: the `[3/12]` count
        self._ran: set[str] = set()  # stages whose result in build/ changed in this run
        super().initialize(tasks, selected_tasks)

    def _refuse_missing_toolchains(self, tasks: dict) -> int:
        """Before doit starts any task: the stages a missing toolchain blocks are refused at
        once (cli/preflight.py), with one error listing each missing piece and its fix.
        Returns how many stage lines the run will show (the `[3/12]` total)."""
        stages = _stages_reached(tasks, self._selected)
        refused = preflight(self.root, tasks, stages, sys.argv[1:])
        if refused is None:
            return len(stages)
        self._refused_roots = set(refused.blocked.roots)
        self.write(f"ERROR: {refused.message}\n")
        # What only the refused stages needed is reached no more; after them, no line each.
        return len(_stages_reached(tasks, self._selected) - refused.blocked.downstream)

    def _checks(self) -> Checks:
        """The checks and artifact aliases of the project's targets (loaded once per run)."""
        if getattr(self, "_checks_of", None) is None:
            # those of this run's tasks
            self._checks_of = table_at(self.root).checks(run_models(self.root))
        return self._checks_of

    def _events_path(self) -> Path:
        return Path(self.root) / "build" / "events.jsonl"

    def execute_task(self, task: Any) -> None:
        """A stage says what it came to when it ends (and a build announces itself)."""
        gcpause.resume()  # something runs: collection as before (cli/gcpause.py)
        if _is_stage(task):
            return
        super().execute_task(task)

    def skip_uptodate(self, task: Any) -> None:
        if _is_stage(task):
            values = {"outcome": "uptodate", "why": self._cutoff(task.name)}
            self.write(task_line(task.name, values, self._count()) + "\n")
        else:
            super().skip_uptodate(task)
        self._uptodate.append(task.name)  # one summary event for all of them, at the end
        self._succeeded.add(task.name)
        self._verdict(task)

    def add_success(self, task: Any) -> None:
        super().add_success(task)
        self._stage_ended(task)
        self._succeeded.add(task.name)
        values = getattr(task, "values", None) or {}
        if values.get("outcome") == "uptodate":
            values = {**values, "why": self._cutoff(task.name)}
        elif values.get("outcome"):
            self._ran.add(task.name)
        if values.get("outcome"):
            self.write(task_line(task.name, values, self._count()) + "\n")
        elif values.get("lock"):
            self.write(_lock_line(task.name, values) + "\n")
        self._verdict(task)

    def _stage_ended(self, task: Any) -> None:
        """A stage that ran may have replaced its folder in another process (`doit -n N`
        runs stages in worker processes): what this process stat-ed of it is forgotten, so
        the check of a stage after it looks at the new files, not at what the folder held
        before; and the verdict the worker kept is kept here, where it is saved."""
        if not _is_stage(task):
            return
        fast = fast_path_at(self.root)
        stage, _, model = task.name.partition(":")
        fast.forget(f"build/{model}/{stage}")
        verdict = (getattr(task, "values", None) or {}).get("verdict")
        if verdict is not None:
            fast.adopt(task.name, verdict)

    def _count(self) -> str:
        """The next stage line's `[3/12] `, in a run that shows more than one stage."""
        self._shown = getattr(self, "_shown", 0) + 1
        return progress(self._shown, getattr(self, "_stage_total", 0))

    def _cutoff(self, task: str) -> str:
        """Why a stage is up to date after its upstream ran again in this run: its key holds
        the upstream's output digests, so those bytes came out as they were (early cutoff)."""
        ran = getattr(self, "_ran", set())
        if not ran:
            return ""  # nothing ran before it (every stage of a no-op)
        table = table_at(self.root)
        if table.is_stage(task) and any(up in ran for up in table.upstream_of(task)):
            return "same bytes upstream"
        return ""

    def _verdict(self, task: Any) -> None:
        """A check's result is what the user came for: say it, whatever ran or not (from
        the fast path's note while the check stays up to date)."""
        if self._checks().stage_of(task.name) is None:
            return
        line = fast_path_at(self.root).note(task.name) or \
            check_verdict(Path(self.root), task.name, checks=self._checks())
        if line:
            self.write(f"   {line}\n")

    def add_failure(self, task: Any, fail: Any) -> None:
        if isinstance(fail, UnmetDependency):
            # doit's block per dependent task says only that an upstream failed: one line
            # (the upstream's own error was shown when it failed).
            self._blocked.add(task.name)  # said once, at the end (`_blocked_line`)
            return
        self._failed[task.name] = getattr(fail, "message", "") or str(fail)
        self._stage_ended(task)
        if task.name in getattr(self, "_refused_roots", ()):
            # Its reason is in the run's one ERROR, said up front: here only its own line.
            why = self._failed[task.name].removeprefix(f"{task.name}: ")
            self.write(labelled("failed", f"{task.name} — {why}", self._count()) + "\n")
            return
        if isinstance(fail, TaskFailed) and not fail.traceback:
            count = self._count() if _is_stage(task) else ""
            self.write(labelled("failed", task.name, count) + "\n")
            self.write(f"ERROR: {fail.message}\n")  # ours: already one line, no traceback
            line = check_verdict(Path(self.root), task.name, failed=True,
                                 checks=self._checks())
            if line:
                self.write(f"   {line}\n")
            return
        super().add_failure(task, fail)

    def complete_run(self) -> None:
        gcpause.resume()
        try:
            super().complete_run()
            self._blocked_line()
            self._group_table()
            self._summarize()
            self._flush_uploads()
        finally:
            close_engines()
            self._lock.release()

    def _flush_uploads(self) -> None:
        """Results an earlier run stored but never uploaded (killed, or the cache was down)
        go now; a run with nothing pending pays one folder listing."""
        if not table_at(self.root).uploads:
            return  # read from the declarations' table: a no-op loads no settings
        project = project_at(self.root)
        cache = project.settings.cache
        from ..store.store import STORE_FORMAT  # only where uploads are on
        from ..store.upload_queue import UploadQueue

        if not UploadQueue(project.paths.store / STORE_FORMAT, cache.remote).pending():
            return
        sent = engine_for(self.root).flush_uploads()
        if sent:
            self.write(f"uploaded {sent} result{'s' if sent > 1 else ''} of earlier runs to "
                       f"{cache.shown}\n")

    def _blocked_line(self) -> None:
        line = blocked_line(sorted(t for t in getattr(self, "_blocked", ()) if ":" in t))
        if line:
            self.write(line + "\n")

    def _group_table(self) -> None:
        selected = getattr(self, "_selected", [])
        checks = self._checks()
        wanted = members(selected, getattr(self, "_known", []), checks)
        groups = [g for g in checks.groups if g in selected]
        if not wanted and not groups:
            return
        broken = table_at(self.root).broken if groups else {}
        table = rows(Path(self.root), wanted, self._succeeded, self._failed, self._blocked,
                     broken, groups, checks, fast_path_at(self.root).note)
        for line in table_lines(table, checks):
            self.write(line + "\n")

    def _summarize(self) -> None:
        fast_path_at(self.root).save()
        uptodate = getattr(self, "_uptodate", [])
        events = events_since(self._events_path(), getattr(self, "_events_at", 0))
        failed = getattr(self, "_failed", {})
        if not events and not uptodate and not failed and not getattr(self, "_succeeded", ()):
            return  # nothing ran (a lock or keep task alone still gets its end line)
        counts = outcome_counts(events, uptodate)
        # A refused declaration (e.g. an unpinned fetch) fails before any event is written.
        counts["failed"] = max(counts["failed"], sum(":" in t for t in failed))
        wall = time.monotonic() - self._started
        self.write(summary_line(counts, wall, self._critical(events)) + "\n")
        if not events and not uptodate:
            return  # only refusals: bad input leaves build/ as it was
        EventLog(self._events_path()).summary(counts, uptodate)
        path, offset = self._events_path(), getattr(self, "_events_at", 0)
        # A trace only of a run where something ran (write_trace keeps the last one
        # otherwise): a no-op reads back its summary line and never imports the tracer.
        if events or any(ran(line) for line in read_events(path, offset)[0]):
            from ..report.trace import write_trace

            write_trace(path, offset)

    def _critical(self, events: list[dict[str, Any]]) -> str:
        """The chain of tasks that set a parallel run's end (`doit -n N`); a serial run's
        chain is every task it ran, so it is not said."""
        if processes(sys.argv[1:]) < 2 or len({e.get("task") for e in events}) < 2:
            return ""
        from ..report.critical import critical_path, path_text

        deps = {name: list(t.task_dep) for name, t in getattr(self, "_tasks", {}).items()}
        return path_text(critical_path(events, deps))


def _stages_reached(tasks: dict[str, Any], selected: list[str]) -> set[str]:
    """The stage tasks a run of `selected` reaches through task_dep: each gets a line."""
    seen: set[str] = set()
    todo = list(selected)
    while todo:
        name = todo.pop()
        if name in seen or name not in tasks:
            continue
        seen.add(name)
        todo += tasks[name].task_dep
    return {n for n in seen if _is_stage(tasks[n])}


def _lock_line(task: str, values: dict[str, Any]) -> str:
    """`locked     lock:m  models/m.lock.json: 3 files at 0123abcd… (from hub)`."""
    files = values.get("files", 0)
    text = f"{task}  {values['lock']}: {files} file{'s' if files != 1 else ''}"
    if values.get("revision"):
        text += f" at {str(values['revision'])[:12]}"
    if values.get("from"):
        text += f" (from {values['from']})"
    return labelled("locked", text)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _is_stage(task: Any) -> bool:
    """A hefbuild stage task (cli/tasks.py marks it in its `meta`), not a group, alias,
    lock, image or keep task: which names are stages is the targets' business. (Not from
    its action: doit makes a task's action objects when first asked for them, and an up to
    date task never needs them.)"""
    return ":" in task.name and (getattr(task, "meta", None) or {}).get("hefbuild") == STAGE
