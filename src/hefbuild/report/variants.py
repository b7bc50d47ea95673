"""A recipe sweep side by side: a model and its variants (`<model>@<variant>`), one column
each, for the build report.

Pure: it takes the report's per-model views and the manifests the snapshot read, and
returns typed rows; variants_html.py and variants_text.py draw them. First come the
declared parameters that differ between the columns (what the sweep varies, as
`dvc exp show` puts an experiment's parameters first). A stage is shared when every
column holds a result of one key (built once, restored for the others); its time is the
rule's, when the result was built, so a shared stage shows the same seconds everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..declare.variants import VARIANT_SEP
from .model import (
    AGREEMENT,
    MEAN,
    TEACHER_FORCED,
    Check,
    FigureRow,
    ModelReport,
    ParamRow,
    Stage,
    StageCell,
    StageComparison,
    Sweep,
)


def base_of(model: str) -> str:
    return model.partition(VARIANT_SEP)[0]


def compare_variants(models: Sequence[ModelReport],
                     files: Mapping[str, dict[str, Any]]) -> tuple[Sweep, ...]:
    """A sweep per model that has a variant with anything in build/; `models` in report
    order (a base before its variants), `files` the snapshot's JSON by path."""
    families: dict[str, list[ModelReport]] = {}
    for m in models:
        if m.touched:
            families.setdefault(base_of(m.name), []).append(m)
    return tuple(sweep(base, members, files) for base, members in families.items()
                 if any(VARIANT_SEP in m.name for m in members))


def sweep(base: str, members: Sequence[ModelReport],
          files: Mapping[str, dict[str, Any]]) -> Sweep:
    members = sorted(members, key=lambda m: (m.name != base, m.name))
    stages = tuple(
        StageComparison(stage.name, tuple(_cell(m.name, m.stages[i], files) for m in members))
        for i, stage in enumerate(members[0].stages))
    checks = [{c.stage: c for c in m.checks} for m in members]
    order = list(dict.fromkeys(s for per in checks for s in per))
    figures = tuple(row for stage in order for row in _figure_rows(stage, [c.get(stage)
                                                                           for c in checks]))
    passed = tuple((stage, tuple(_verdict(c.get(stage)) for c in checks)) for stage in order)
    return Sweep(base, tuple(m.name for m in members), stages, figures, passed,
                 param_rows(members))


def param_rows(members: Sequence[ModelReport]) -> tuple[ParamRow, ...]:
    """The declared parameters whose values are not the same in every column (what the
    sweep varies), stage by stage in chain order, each stage's by name. A value that
    differs only by naming its own model (a `{model}` default) is the same recipe."""
    rows = []
    for stage in (s.name for s in members[0].stages):
        tables = [m.params.get(stage, {}) for m in members]
        for name in sorted(set().union(*tables)):
            values = tuple(shown_value(t[name]) if name in t else "–" for t in tables)
            recipes = {v.replace(m.name, "{model}") for v, m in zip(values, members, strict=True)}
            if len(recipes) > 1:
                rows.append(ParamRow(stage, name, values))
    return tuple(rows)


def shown_value(value: Any) -> str:
    """A parameter as a person wrote it: true/false, a list by commas, else as is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ", ".join(shown_value(v) for v in value)
    return str(value)


def _cell(model: str, stage: Stage, files: Mapping[str, dict[str, Any]]) -> StageCell:
    manifest = files.get(f"build/{model}/{stage.name}/manifest.json") or {}
    if stage.key is None or manifest.get("key") != stage.key:
        manifest = {}  # a running or failed stage: no result of its own to size
    seconds = stage.build_seconds if stage.build_seconds is not None else stage.seconds
    return StageCell(stage.state.value, stage.key, seconds, _size(manifest))


def _size(manifest: dict[str, Any]) -> int | None:
    outputs = manifest.get("outputs")
    if not isinstance(outputs, dict):
        return None
    sizes = [o.get("size") for o in outputs.values() if isinstance(o, dict)]
    return sum(s for s in sizes if isinstance(s, int)) if sizes else None


def _verdict(check: Check | None) -> bool | None:
    return None if check is None else check.passed


def _figure_rows(stage: str, checks: list[Check | None]) -> Iterable[FigureRow]:
    """Per prompt (in the order the columns first name them), each figure some column has;
    then the means."""
    prompts = list(dict.fromkeys(p.prompt for c in checks if c for p in c.prompts))
    for prompt in prompts:
        found = [{p.prompt: p for p in c.prompts}.get(prompt) if c else None for c in checks]
        for figure, attr in ((TEACHER_FORCED, "teacher_forced"), (AGREEMENT, "agreement")):
            values = tuple(getattr(p, attr) if p else None for p in found)
            if any(v is not None for v in values):
                yield FigureRow(stage, prompt, figure, values)
    for figure, attr in ((TEACHER_FORCED, "mean_teacher_forced"), (AGREEMENT, "mean_agreement")):
        values = tuple(getattr(c, attr) if c else None for c in checks)
        if any(v is not None for v in values):
            yield FigureRow(stage, MEAN, figure, values)
