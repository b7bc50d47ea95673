"""What the rebuilder writes down after each task: one event line (outcome, time, peak
memory, the check's figures), a built stage's duration in the store's history (the next
build's ETA), and the values doit's reporter prints on the task's line."""

from __future__ import annotations

import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..plan.actions import Action
from ..plan.key import ActionKey
from ..store.events import Outcome, peak_rss_mb
from ..store.store import Record
from .context import Context
from .failures import one_line
from .verdicts import check_figures


class Recorder:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def failed(self, task: str, key: ActionKey | None, start: float,
               exc: BaseException) -> None:
        self.ctx.fast.drop(task)
        peak = getattr(exc, "peak_rss_mb", None) or peak_rss_mb()  # the rule's, if it ran
        env = self._env(task)
        self.ctx.events.append(task, key.hex if key else None, Outcome.FAILED,
                               time.monotonic() - start - env.get("env_s", 0.0), peak, **env,
                               error=one_line(exc))

    def done(self, action: Action, key: ActionKey, outcome: Outcome, record: Record | None,
             extra: dict[str, Any], start: float) -> dict[str, Any]:
        """The event of a finished task; the values of its line (doit's task values)."""
        ctx = self.ctx
        built = outcome is Outcome.BUILT
        peak = record.peak_rss_mb if record and built else peak_rss_mb()
        env = self._env(action.task)
        seconds = time.monotonic() - start - env.get("env_s", 0.0)
        measured = self._duration(action, record) if built and record else {}
        if outcome is not Outcome.UPTODATE:
            measured.update(check_figures(ctx.paths.root, action.task, ctx.checks))
        ctx.events.append(action.task, key.hex, outcome, seconds, peak, **extra, **env,
                          **measured)
        shown: dict[str, Any] = {"seconds": round(seconds, 3), **env}
        if built and peak:
            shown["peak_rss_mb"] = round(peak)  # the rule's own peak, for the task's line
        return {"outcome": outcome.value, "key": key.hex, **shown, **extra}

    def _env(self, task: str) -> dict[str, Any]:
        """The time the task's toolchain environment took (engine/envs.py), taken off the
        task's own and named beside it."""
        waited = self.ctx.env_waits.pop(task, None)
        return {} if waited is None else {"env": waited[0], "env_s": round(waited[1], 3)}

    def _duration(self, action: Action, record: Record) -> dict[str, Any]:
        """A built stage's run time joins the store's history; returns the fields that
        make it comparable, for the `built` event too."""
        from ..store import history

        fields = history_fields(self.ctx.paths.root, action, record.description)
        history.record_duration(self.ctx.store.root, action.task, record.key, record.seconds,
                                record.peak_rss_mb, **fields)
        return fields


def history_fields(root: Path, action: Action, description: dict[str, Any]) -> dict[str, Any]:
    """What makes two builds of a stage comparable (store/history.py): a fingerprint of
    the rule's code and the bytes the stage reads (upstream outputs and file parameters)."""
    from ..store.history import rule_fingerprint

    paths = [root / "build" / action.model / rel for rel in description.get("inputs", {})]
    paths += [root / f["path"] for f in description.get("files", {}).values()]
    size = 0
    for path in paths:
        with suppress(OSError):
            size += path.stat().st_size
    return {"rule": rule_fingerprint(description.get("rule", {})), "input_bytes": size}
