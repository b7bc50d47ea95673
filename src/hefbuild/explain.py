"""Why a task would run: the difference between its last build and now, field by field."""

from __future__ import annotations

from .engine import MANIFEST, Engine
from .events import Outcome, read_json
from .key import diff_descriptions


def explain_task(engine: Engine, task: str) -> list[str]:
    action = engine.actions[task]
    blocked = _first_stale_upstream(engine, task)
    if blocked is not None:
        up, why = blocked
        return [f"{task}: would run after upstream {up}, which would run first: {why}",
                f"  its inputs are {up}'s outputs; if they come out byte-identical, {task} "
                f"stays as it is (early cutoff)"]
    decision = engine.decide(action)
    key = decision.key
    if decision.outcome is Outcome.UPTODATE:
        return [f"{task}: up to date (key {key.hex[:12]})"]
    lines = [f"{task}: would run ({decision.reason.split(';')[0]})"]
    lines += _last_failure(engine, task)
    manifest = read_json(engine.paths.root / action.out_dir / MANIFEST)
    if manifest is not None and "description" in manifest:
        changes = diff_descriptions(manifest["description"], key.description)
        lines += [f"  changed since the last build: {c}" for c in changes]
    if decision.outcome is Outcome.RESTORED:
        lines.append(f"  the result for key {key.hex[:12]} is in the store: it would be "
                     f"restored, no rule run")
    else:
        lines.append(f"  no stored result for key {key.hex[:12]}: rules/{action.rule} would run")
    return lines


def _first_stale_upstream(engine: Engine, task: str) -> tuple[str, str] | None:
    """The earliest upstream task that is not up to date, with its reason."""
    action = engine.actions[task]
    for up in action.upstream:
        up_task = f"{up}:{action.model}"
        deeper = _first_stale_upstream(engine, up_task)
        if deeper is not None:
            return deeper
        decision = engine.decide(engine.actions[up_task])
        if decision.outcome is not Outcome.UPTODATE:
            return up_task, decision.reason
    return None


def _last_failure(engine: Engine, task: str) -> list[str]:
    """Where the last failed run of a task left its log and the outputs it wrote."""
    action = engine.actions[task]
    folder = engine.paths.root / "build" / action.model
    log = folder / f"{action.stage}.failed.log"
    if not log.is_file():
        return []
    line = f"  its last run failed: build/{action.model}/{log.name}"
    kept = folder / f"{action.stage}.failed"
    if kept.is_dir():
        names = sorted(p.relative_to(folder).as_posix() for p in kept.rglob("*") if p.is_file())
        line += "; what it wrote: " + ", ".join(f"build/{action.model}/{n}" for n in names)
    return [line]
