"""How a stage is described to its executor (a `StageRun`): the rule's action JSON, its
inputs and files (read-only), its scratch folder, environment, limits, sandbox, network
(the source stage alone), the heartbeat watch and the digests a cluster moves files by."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..declare.toolchains import ToolchainSpec
from ..plan.actions import Action
from ..plan.key import ActionKey
from .context import Context
from .record import history_fields

if TYPE_CHECKING:
    from ..declare.phases import PhaseTable
    from ..declare.targets import TargetSpec
    from ..execute import StageRun, Watch


class StageRunMaker:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._said_unsandboxed = False
        self._targets: dict[str, TargetSpec] | None = None  # read when a stage first builds

    def make(self, action: Action, key: ActionKey, scratch: Path, python: str) -> StageRun:
        from ..execute import StageRun
        from ..plan.limits import device_target, stage_limits

        for sub in ("out", "work"):
            (scratch / sub).mkdir()
        ctx = self.ctx
        tc = ctx.project.toolchains[action.toolchain]
        rule_action = {"model": action.model, "stage": action.stage, "target": action.target,
                       "params": action.params, "source": action.source,
                       "outputs": list(action.outputs)}
        if tc.device:
            rule_action["device"] = device_target(tc)
        network = action.source is not None  # the source stage only
        root = ctx.paths.root
        return StageRun(
            sandbox=self._sandboxed(tc), network=network,
            writable=hub_cache_dirs() if network else (),
            task=action.task, interpreter=python, rules_dir=ctx.paths.rules,
            rule=action.rule, action=rule_action,
            inputs={up: root / f"build/{action.model}/{up}" for up in action.upstream},
            files={**{k: root / v for k, v in action.file_params.items()},
                   **self._source_dir(action)},
            scratch=scratch, env=dict(tc.env), limits=stage_limits(action, tc),
            watch=self._watch(action, key),
            image=key.description["toolchain"].get("image_id"),
            digests=self._read_digests(action, key),
            toolchain=action.toolchain, identity=key.description["toolchain"],
        )

    def _read_digests(self, action: Action, key: ActionKey) -> dict[Path, str]:
        """Where each file the key names is, with its digest (a cluster moves them by it)."""
        d, paths = key.description, self.ctx.paths
        found = {paths.root / "build" / action.model / rel: digest
                 for rel, digest in d["inputs"].items()}
        found.update({paths.root / f["path"]: f["digest"] for f in d["files"].values()})
        found.update({paths.rules / rel: digest for rel, digest in d["rule"].items()})
        return found

    def _source_dir(self, action: Action) -> dict[str, Path]:
        """The source stage of a local source reads its folder (read-only in the sandbox); the
        folder is in no key: the files' digests are (moving it changes nothing)."""
        src = self.ctx.project.models[action.model].source
        if action.source is None or src.path is None:
            return {}
        return {"source_dir": Path(src.path)}

    def _sandboxed(self, tc: ToolchainSpec) -> bool:
        """Host stages run in bubblewrap unless the project opted out (said once)."""
        if tc.kind not in ("host", "venv"):
            return False  # a container is its own sandbox; a device stage reaches a device
        sandbox = self.ctx.project.settings.sandbox
        if not sandbox and not self._said_unsandboxed:
            self._said_unsandboxed = True
            self.ctx.warn("host stages run without a sandbox (sandbox = false in hefbuild.toml "
                          "or HEFBUILD_SANDBOX=0): a rule can read and write anything you can")
        return sandbox

    def _watch(self, action: Action, key: ActionKey) -> Watch:
        from ..execute import Watch

        # Read only here, when a stage is about to build: never on a no-op or `doit list`.
        from ..store import history

        ctx = self.ctx

        def emit(beat: dict[str, Any]) -> None:
            ctx.events.heartbeat(action.task, key.hex, beat)
            ctx.say(f"[hefbuild] {action.task}: {beat['message']}")

        fields = history_fields(ctx.paths.root, action, key.description)
        usual = history.usual(history.read_durations(ctx.store.root), action.stage, **fields)
        return Watch(env_seconds("HEFBUILD_HEARTBEAT_S", 60.0),
                     env_seconds("HEFBUILD_SILENCE_S", 900.0), emit,
                     usual_s=usual.seconds if usual else None,
                     usual_builds=usual.builds if usual else 0,
                     phases=self._phase_table(action.target))

    def _phase_table(self, target: str) -> PhaseTable | None:
        """The target's declared phase table (loaded once, when a first stage builds)."""
        if self._targets is None:
            from ..declare.targets import load_targets

            self._targets = load_targets(self.ctx.paths.root)
        spec = self._targets.get(target)
        return spec.phases if spec is not None else None


def hub_cache_dirs() -> tuple[Path, ...]:
    """Where fetch keeps Hugging Face downloads (writable in its sandbox), created now."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    dirs = [home]
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return tuple(dirs)


def env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default
