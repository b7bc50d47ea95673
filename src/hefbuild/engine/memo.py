"""The fast path's side of the rebuilder: which files a decision read (stat-ed before it
read them, so a change in between shows next time), and the verdict kept after a decision
or a run, with the check's one line for the next no-op to say."""

from __future__ import annotations

from ..plan.actions import Action
from ..plan.key import ActionKey
from .context import Context
from .fastpath import Verdict
from .keys import MANIFEST, KeyMaker
from .verdicts import check_verdict


class VerdictMemo:
    def __init__(self, ctx: Context, keys: KeyMaker) -> None:
        self.ctx, self.keys = ctx, keys

    def still_uptodate(self, action: Action) -> bool:
        return self.ctx.fast.still_uptodate(action.task, self._stamp(action)) is not None

    def depends_on(self, action: Action) -> tuple[int, ...]:
        """Every file a decision about `action` reads, as fast-path indexes."""
        fast = self.ctx.fast
        declared = fast.pin(self.ctx.project.models[action.model].declared)
        paths = [f.in_root for f in self.keys.rule_files(action)]
        paths += sorted(action.file_params.values())
        for up in action.upstream:
            paths += manifest_and_outputs(self.ctx, f"build/{action.model}/{up}")
        indexes = declared + fast.indexes(paths)
        own = fast.indexes(manifest_and_outputs(self.ctx, action.out_dir))
        fast.fingerprint("", indexes + own)  # stat each once, now
        return indexes

    def keep(self, action: Action, key: ActionKey, inputs: tuple[int, ...]) -> None:
        """The files the decision read (stat-ed before) and the outputs as build/ has them."""
        ctx = self.ctx
        own = ctx.fast.indexes(manifest_and_outputs(ctx, action.out_dir))
        paths = inputs + own
        note = check_verdict(ctx.paths.root, action.task, checks=ctx.checks)
        ctx.fast.record(action.task, Verdict(ctx.fast.fingerprint(self._stamp(action), paths),
                                             key.hex, paths, note))

    def _stamp(self, action: Action) -> str:
        return self.ctx.fast.stamp(action.toolchain)


def manifest_and_outputs(ctx: Context, stage_dir: str) -> list[str]:
    manifest = ctx.manifests.read(f"{ctx.paths.root}/{stage_dir}/{MANIFEST}")
    outputs = sorted(manifest.get("outputs", {})) if manifest else []
    return [f"{stage_dir}/{MANIFEST}"] + [f"{stage_dir}/{rel}" for rel in outputs]
