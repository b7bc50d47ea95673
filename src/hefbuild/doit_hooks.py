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
from .events import Outcome, peak_rss_mb, read_json
from .lock import ProjectLock
from .project import STATE_DIR
from .session import engine_for
from .summary import events_since, human_bytes, summary_line


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
        self._events_at = _size(self._events_path())
        super().initialize(tasks, selected_tasks)

    def _events_path(self) -> Path:
        return Path(self.root) / "build" / "events.jsonl"

    def skip_uptodate(self, task: Any) -> None:
        super().skip_uptodate(task)
        engine = engine_for(self.root)
        checked = engine.last_check.get(task.name)
        if checked is not None:
            decision, seconds = checked
            engine.events.append(task.name, decision.key.hex, Outcome.UPTODATE, seconds,
                                 peak_rss_mb())
        self._verdict(task)

    def add_success(self, task: Any) -> None:
        super().add_success(task)
        values = getattr(task, "values", None) or {}
        if values.get("outcome") == Outcome.REMOTE.value:
            self.write(f"   {task.name}: remote ({human_bytes(values.get('bytes', 0))} in "
                       f"{values.get('remote_seconds', 0):.2f} s, verified)\n")
        self._verdict(task)

    def _verdict(self, task: Any) -> None:
        """A check's result is what the user came for: say it, whatever ran or not."""
        if not task.name.startswith("verify:"):
            return
        model = task.name.split(":", 1)[1]
        report = read_json(Path(self.root) / "build" / model / "verify" / "report.json")
        if report is None:
            return
        verdict = "passed" if report.get("passed") else "FAILED"
        if (report.get("device") or {}).get("fake"):
            verdict += " on the HailoRT TEST DOUBLE (not a device)"
        self.write(f"   {task.name}: {verdict}, mean token agreement "
                   f"{report.get('mean_agreement', 0):.2f} over {len(report.get('prompts', []))}"
                   f" prompts (minimum {report.get('min_token_agreement')}); "
                   f"build/{model}/verify/report.json\n")

    def add_failure(self, task: Any, fail: Any) -> None:
        if isinstance(fail, TaskFailed) and not fail.traceback:
            self.write(f"ERROR: {fail.message}\n")  # ours: already one line, no traceback
            return
        super().add_failure(task, fail)

    def complete_run(self) -> None:
        try:
            super().complete_run()
            events = events_since(self._events_path(), getattr(self, "_events_at", 0))
            if events:
                self.write(summary_line(events) + "\n")
        finally:
            self._lock.release()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
