"""Putting a result into build/<model>/<stage>/: its outputs hard-linked from the store (a
copy across file systems), its log copied, its manifest written, and the folder swapped in
as a whole, so a crash leaves the old folder or the new one, never a mix."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..plan.actions import Action
from ..plan.key import ActionKey
from ..store.events import Outcome
from ..store.store import Record
from ..store.storelock import register_project
from .context import Context
from .keys import IN_REMOTE, MANIFEST

LOG = "log.txt"


class Installer:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._registered = False

    def install(self, action: Action, key: ActionKey, outcome: Outcome, record: Record,
                extra: dict[str, Any], start: float,
                ) -> tuple[Outcome, Record, dict[str, Any]]:
        self._register()
        manifest = manifest_of(action, key, record, outcome, time.monotonic() - start)
        if "ran_on" in extra:
            manifest["ran_on"] = extra["ran_on"]  # the cluster node that built it
        self._materialize(action, record, manifest)
        self.ctx.store.touch(key.hex)
        return outcome, record, extra

    def install_lazy(self, action: Action, key: ActionKey, record: Record, log_size: int,
                     extra: dict[str, Any], start: float,
                     ) -> tuple[Outcome, Record, dict[str, Any]]:
        """A remote hit whose bytes stay in the remote cache: the folder holds its manifest
        alone, which names every output with its digest (what downstream keys are made
        of) and lists what is not there under `in_remote` (engine/lazy.py)."""
        self._register()
        manifest = manifest_of(action, key, record, Outcome.REMOTE, time.monotonic() - start)
        manifest["log"] = {"digest": record.log, "size": log_size}
        manifest[IN_REMOTE] = sorted(record.outputs) + [LOG]
        self._materialize(action, record, manifest, files=False)
        return Outcome.REMOTE, record, {**extra, "in_remote": len(record.outputs)}

    def _register(self) -> None:
        """Once per invocation that puts anything in build/ (never on a no-op): the project
        is known to `doit gc`, and the digest table is pruned (at most once a day)."""
        if not self._registered:
            register_project(self.ctx.store.root, self.ctx.paths.root)
            self.ctx.stats.prune()
            self._registered = True

    def _materialize(self, action: Action, record: Record, manifest: dict[str, Any],
                     files: bool = True) -> None:
        store = self.ctx.store
        final = self.ctx.paths.root / action.out_dir
        for stale in final.parent.glob(f".{action.stage}.*-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed run; we hold the lock
        staging = final.parent / f".{action.stage}.new-{os.getpid()}"
        staging.mkdir(parents=True, exist_ok=True)
        for rel, out in record.outputs.items() if files else ():
            store.materialize(out.digest, staging / rel)
        if files:
            # A copy, not a link: an edit of build/'s log must not reach the store and the
            # other projects (logs are bounded, so a copy is cheap).
            store.copy_out(record.log, staging / LOG)
        (staging / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, indent=1))
        _swap_dir(staging, final)
        self.ctx.fast.forget(action.out_dir)
        (final.parent / f"{action.stage}.failed.log").unlink(missing_ok=True)
        shutil.rmtree(final.parent / f"{action.stage}.failed", ignore_errors=True)


def manifest_of(action: Action, key: ActionKey, record: Record, outcome: Outcome,
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


def _swap_dir(new: Path, final: Path) -> None:
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(new, final)
    shutil.rmtree(old, ignore_errors=True)
