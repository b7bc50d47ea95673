"""An action's key, from what can change its result: the rule's code, the content of its
inputs and file parameters, its parameters and source, the toolchain's identity and
environment (plan/key.py makes the canonical description and its digest)."""

from __future__ import annotations

import os
from typing import NamedTuple

from ..errors import SpecError, StageError
from ..plan.actions import Action, rule_code_files
from ..plan.key import ActionKey, describe
from .context import Context

MANIFEST = "manifest.json"
# The manifest's list of the stage's files that are in the remote cache, not in its folder
# (`[cache] download = "minimal"`, engine/lazy.py): their digests are the manifest's.
IN_REMOTE = "in_remote"


class RuleFile(NamedTuple):
    path: str
    in_rules: str  # its name under rules/ (as the key has it)
    in_root: str  # and under the project root (as the fast path lists it)


class KeyMaker:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # (rule, code...) -> each file: its path, and its name under rules/ and the root.
        # Made once per invocation: a no-op's full path of 5000 tasks spent a fifth of its
        # time building these Paths and their relative names again.
        self._rule_files: dict[tuple[str, ...], list[RuleFile]] = {}

    def key_of(self, action: Action) -> ActionKey:
        ctx = self.ctx
        tc = ctx.project.toolchains[action.toolchain]
        self._check_pinned(action)
        ctx.toolchains.check(tc)  # a pin that no longer holds is never "up to date"
        return ActionKey.of(describe(
            stage=action.stage,
            outputs=action.outputs,
            rule=self._rule_digests(action),
            inputs=self._input_digests(action),
            files={name: {"path": path, "digest": ctx.stats.digest(ctx.paths.root / path).hex}
                   for name, path in sorted(action.file_params.items())},
            params=action.params,
            source=action.source,
            toolchain=ctx.toolchains.identity(tc),
            env=tc.env,
            gpu=action.limits.gpu,
        ))

    def rule_files(self, action: Action) -> list[RuleFile]:
        code = (action.rule, *action.code)
        files = self._rule_files.get(code)
        if files is None:
            rules, root = self.ctx.paths.rules, self.ctx.paths.root
            files = self._rule_files[code] = [
                RuleFile(str(p), p.relative_to(rules).as_posix(), p.relative_to(root).as_posix())
                for p in rule_code_files(rules, action.rule, action.code)]
        return files

    def _check_pinned(self, action: Action) -> None:
        """The source stage must be fixed-output: a commit and a digest for every file."""
        model = self.ctx.project.models[action.model]
        src = model.source
        if action.source is None or src.pinned:
            return
        locked = model.variant_of or model.name  # a variant uses its base model's lock
        if src.path is not None:
            raise SpecError(model.file, "source.files",
                            f"every file's sha256 for the folder {src.path}; run "
                            f"`doit lock:{locked}` to write them to its lock")
        raise SpecError(model.file, "source.revision",
                        f"a 40-hex commit with file digests, got {src.revision!r} (a branch?); "
                        f"run `doit lock:{locked}` where the hub is reachable to pin it")

    def _rule_digests(self, action: Action) -> dict[str, str]:
        files = self.rule_files(action)
        if not files:
            raise StageError(f"{action.task}: rule program rules/{action.rule} does not exist "
                             f"(the {action.target} pipeline expects it)")
        digest = self.ctx.stats.digest
        return {f.in_rules: digest(f.path).hex for f in files}

    def _input_digests(self, action: Action) -> dict[str, str]:
        digests = {}
        root = str(self.ctx.paths.root)
        for up in action.upstream:
            stage_dir = f"{root}/build/{action.model}/{up}"
            manifest = self.ctx.manifests.read(f"{stage_dir}/{MANIFEST}")
            if manifest is None:
                raise StageError(f"{action.task}: upstream {up}:{action.model} has no result in "
                                 f"build/ (run it first)")
            remote_only = set(manifest.get(IN_REMOTE, ()))
            for rel in sorted(manifest["outputs"]):
                path = f"{stage_dir}/{rel}"
                if rel in remote_only and not os.path.lexists(path):
                    digests[f"{up}/{rel}"] = manifest["outputs"][rel]["digest"]
                    continue
                try:
                    digests[f"{up}/{rel}"] = self.ctx.stats.digest(path).hex
                except OSError as exc:
                    raise StageError(f"{action.task}: upstream output build/{action.model}/{up}/"
                                     f"{rel} is missing ({exc.strerror}); run {up}:"
                                     f"{action.model} again") from exc
        return digests
