"""The up-to-date decision, with its reason: a pure function of the current key, what
build/ holds and whether the store has the key's result. Nothing here writes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..plan.actions import Action
from ..plan.key import ActionKey, short_reason
from ..store.events import Outcome
from .context import Context
from .keys import IN_REMOTE, MANIFEST, KeyMaker


@dataclass(frozen=True)
class Decision:
    outcome: Outcome  # UPTODATE, RESTORED or BUILT: what `run` would do now
    reason: str
    key: ActionKey
    why: str = ""  # the reason in a few words, for the task's line (`params.samples 32 → 16`)


class Decider:
    def __init__(self, ctx: Context, keys: KeyMaker) -> None:
        self.ctx, self.keys = ctx, keys

    def decide(self, action: Action) -> Decision:
        key = self.keys.key_of(action)
        stage_dir = self.ctx.paths.root / action.out_dir
        stale = self._stale(stage_dir, self.ctx.manifests.read(f"{stage_dir}/{MANIFEST}"), key)
        if stale is None:
            return Decision(Outcome.UPTODATE, "outputs in build/ match the current key", key)
        reason, why = stale
        if self.ctx.store.has_record(key.hex):
            return Decision(Outcome.RESTORED, reason + "; the result is in the store", key,
                            why or "not in build/")
        return Decision(Outcome.BUILT, reason + "; no stored result for this key", key,
                        why or "new")

    def _stale(self, stage_dir: Path, manifest: dict[str, Any] | None,
               key: ActionKey) -> tuple[str, str] | None:
        """Why build/ does not hold the key's result, in a sentence and in a few words
        (empty: nothing of it is in build/); None when it does."""
        if manifest is None:
            return "no result in build/", ""
        if manifest.get("key") != key.hex:
            last = manifest.get("description")
            why = short_reason(last, key.description) if isinstance(last, dict) else ""
            return ("inputs, parameters, rule or toolchain changed since the last build",
                    why or "key changed")
        broken = self._first_changed_output(stage_dir, manifest)
        if broken is None:
            return None
        return f"{broken} in build/ was changed or removed", f"{broken} changed in build/"

    def _first_changed_output(self, stage_dir: Path, manifest: dict[str, Any]) -> str | None:
        remote_only = set(manifest.get(IN_REMOTE, ()))  # absent by design, decided by digest
        for rel, out in sorted(manifest.get("outputs", {}).items()):
            if rel in remote_only and not os.path.lexists(stage_dir / rel):
                continue
            try:
                if self.ctx.stats.digest(stage_dir / rel).hex != out["digest"]:
                    return rel
            except OSError:
                return rel
        return None
