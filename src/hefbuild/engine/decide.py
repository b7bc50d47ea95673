"""The up-to-date decision, with its reason: a pure function of the current key, what
build/ holds and whether the store has the key's result. Nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..plan.actions import Action
from ..plan.key import ActionKey
from ..store.events import Outcome, read_json
from .context import Context
from .keys import MANIFEST, KeyMaker


@dataclass(frozen=True)
class Decision:
    outcome: Outcome  # UPTODATE, RESTORED or BUILT: what `run` would do now
    reason: str
    key: ActionKey


class Decider:
    def __init__(self, ctx: Context, keys: KeyMaker) -> None:
        self.ctx, self.keys = ctx, keys

    def decide(self, action: Action) -> Decision:
        key = self.keys.key_of(action)
        stage_dir = self.ctx.paths.root / action.out_dir
        manifest = read_json(stage_dir / MANIFEST)
        if manifest is not None and manifest.get("key") == key.hex:
            broken = self._first_changed_output(stage_dir, manifest)
            if broken is None:
                return Decision(Outcome.UPTODATE, "outputs in build/ match the current key", key)
            reason = f"{broken} in build/ was changed or removed"
        elif manifest is None:
            reason = "no result in build/"
        else:
            reason = "inputs, parameters, rule or toolchain changed since the last build"
        if self.ctx.store.has_record(key.hex):
            return Decision(Outcome.RESTORED, reason + "; the result is in the store", key)
        return Decision(Outcome.BUILT, reason + "; no stored result for this key", key)

    def _first_changed_output(self, stage_dir: Path, manifest: dict[str, Any]) -> str | None:
        for rel, out in sorted(manifest.get("outputs", {}).items()):
            try:
                if self.ctx.stats.digest(stage_dir / rel).hex != out["digest"]:
                    return rel
            except OSError:
                return rel
        return None
