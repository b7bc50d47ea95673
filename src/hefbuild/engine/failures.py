"""What a user reads when a stage fails: one line naming the task, the cause and the fix.

Pure functions of what happened (the action, the executor's result, the OS error); the
engine raises them, the CLI prints them.
"""

from __future__ import annotations

import errno
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import HefbuildError, StageError, StoreError

if TYPE_CHECKING:
    from ..execute import ExecResult, StageRun
    from ..plan.actions import Action


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def failure_message(action: Action, stage: StageRun, result: ExecResult,
                     store: Path) -> str:
    from ..execute.host import log_tail
    from ..execute.watch import MIB

    rel_log = f"build/{action.model}/{action.stage}.failed.log"
    where = f"[stages.{action.stage}] of models/{action.model}.toml or [limits] of " \
            f"toolchain/{action.toolchain}.toml"
    if result.killed_for == "timeout":
        return (f"{action.task}: killed at its timeout of {_human_s(stage.limits.timeout_s)} "
                f"(peak memory {result.peak_rss_mb:.0f} MiB); raise `timeout` in {where}; "
                f"log: {rel_log}")
    if result.killed_for == "memory":
        cap = (stage.limits.memory_bytes or 0) / MIB
        # Rounded up: a peak just over the cap must not read as the cap itself.
        return (f"{action.task}: killed at its memory cap of {cap:.0f} MiB (peak "
                f"{math.ceil(result.peak_rss_mb)} MiB); raise `memory` in {where}; "
                f"log: {rel_log}")
    full = _disk_nearly_full(store)
    return (f"{action.task}: rules/{action.rule} failed (exit {result.returncode}): "
            f"{log_tail(stage.log_path)}{full}; log: {rel_log}")


def disk_error(task: str, exc: OSError, store: Path) -> HefbuildError:
    """A failing filesystem, said in one line: which file, what happened, what to do."""
    where = exc.filename or "?"
    in_store = str(where).startswith(str(store))
    fix = {errno.ENOSPC: "free some space" + (" or run `doit gc`" if in_store else ""),
           errno.EDQUOT: "free some space", errno.EROFS: "the filesystem is read-only",
           errno.EACCES: "check its permissions", errno.EPERM: "check its permissions"}
    hint = fix.get(exc.errno or 0, "")
    what = "the store" if in_store else "the project"
    text = f"{task}: {exc.strerror or type(exc).__name__} writing {what} ({where})"
    return (StoreError if in_store else StageError)(text + (f"; {hint}" if hint else ""))


def _disk_nearly_full(path: Path) -> str:
    """A rule writing its outputs into a full store disk says little of why it failed."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return ""
    if usage.free < max(64 << 20, usage.total // 100):
        return (f" (the store's disk is full: {usage.free >> 20} MiB free at {path.parent}; "
                f"free space or run `doit gc`)")
    return ""


def _human_s(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
