"""What hefbuild plugs into doit besides tasks: the file checker and the reporter (which
also holds the project lock for the whole run)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from doit.dependency import FileChangedChecker
from doit.exceptions import TaskFailed
from doit.reporter import ConsoleReporter

from .errors import HefbuildError
from .events import EventLog, Outcome, rotate
from .lock import ProjectLock
from .project import STATE_DIR
from .session import engine_for, fast_path_at
from .summary import check_verdict, events_since, human_bytes, outcome_counts, summary_line


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
    """doit's console output, plus: the project lock, `uptodate` events, one-line errors."""

    root: str = ""

    @classmethod
    def bound_to(cls, root: str) -> type[HefbuildReporter]:
        return type("HefbuildReporter", (cls,), {"root": root})

    def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
        super().__init__(outstream, options)
        self._lock = ProjectLock(Path(self.root) / STATE_DIR / "lock")

    def initialize(self, tasks: dict, selected_tasks: list) -> None:
        wait = os.environ.get("HEFBUILD_NO_WAIT", "") in ("", "0")
        try:
            self._lock.acquire(wait, lambda msg: print(msg, file=sys.stderr, flush=True))
        except HefbuildError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            raise SystemExit(3) from None
        rotate(self._events_path())
        self._events_at = _size(self._events_path())
        self._uptodate: list[str] = []
        super().initialize(tasks, selected_tasks)

    def _events_path(self) -> Path:
        return Path(self.root) / "build" / "events.jsonl"

    def skip_uptodate(self, task: Any) -> None:
        super().skip_uptodate(task)
        self._uptodate.append(task.name)  # one summary event for all of them, at the end
        self._verdict(task)

    def add_success(self, task: Any) -> None:
        super().add_success(task)
        values = getattr(task, "values", None) or {}
        if values.get("outcome") == Outcome.REMOTE.value:
            self.write(f"   {task.name}: remote ({human_bytes(values.get('bytes', 0))} in "
                       f"{values.get('remote_seconds', 0):.2f} s, verified)\n")
        self._verdict(task)

    def _verdict(self, task: Any) -> None:
        """A check's result is what the user came for: say it, whatever ran or not (from
        the fast path's note while the check stays up to date)."""
        if not task.name.startswith("verify:"):
            return
        line = fast_path_at(self.root).note(task.name) or \
            check_verdict(Path(self.root), task.name)
        if line:
            self.write(f"   {line}\n")

    def add_failure(self, task: Any, fail: Any) -> None:
        if isinstance(fail, TaskFailed) and not fail.traceback:
            self.write(f"ERROR: {fail.message}\n")  # ours: already one line, no traceback
            line = check_verdict(Path(self.root), task.name, failed=True)
            if line:
                self.write(f"   {line}\n")
            return
        super().add_failure(task, fail)

    def complete_run(self) -> None:
        try:
            super().complete_run()
            self._summarize()
        finally:
            self._lock.release()


    def _summarize(self) -> None:
        fast_path_at(self.root).save()
        uptodate = getattr(self, "_uptodate", [])
        events = events_since(self._events_path(), getattr(self, "_events_at", 0))
        if not events and not uptodate:
            return
        counts = outcome_counts(events, uptodate)
        self.write(summary_line(counts) + "\n")
        EventLog(self._events_path()).summary(counts, uptodate)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
