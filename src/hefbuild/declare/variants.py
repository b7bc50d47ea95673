"""Recipe sweeps: a model's `[variants.<name>.stages.<stage>]` tables, as data.

A variant is the base model with some stage parameters (or file parameters) overridden; it
becomes a model of its own, `<model>@<name>`, with every task of its target. Here: the
shape of the tables and the merge onto the base's `[stages]`. The merged tables are then
validated by specs.py exactly like the base's, under the variant's key path, so a mistake
in an override reads `variants.<name>.stages.<stage>.<param>: …`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .layout import VARIANT_SEP
from .names import key_part, variant_name_problem

# What a variant inherits and may not change: one checkpoint, one target per model file
# (the lock, the fetch and everything the target derives from it stay the base's).
_BASE_ONLY = ("model", "source")


@dataclass(frozen=True)
class VariantTables:
    name: str
    stages: dict[str, dict[str, Any]]  # stage -> its overrides, as written (unchecked)


def variant_name(model: str, variant: str) -> str:
    """The derived model's name, which task names and build/ folders carry."""
    return f"{model}{VARIANT_SEP}{variant}"


def parse_variants(table: Any, shown: str) -> list[VariantTables]:
    """The `[variants]` table's shape: names, and only stage tables under each."""
    if not isinstance(table, dict):
        raise SpecError(shown, "variants", f"a table of variants, got {type(table).__name__}")
    return [_one(name, body, shown) for name, body in table.items()]


def _one(name: str, body: Any, shown: str) -> VariantTables:
    where = f"variants.{key_part(name)}"
    problem = variant_name_problem(name)
    if problem:
        raise SpecError(shown, where, problem)
    if not isinstance(body, dict):
        raise SpecError(shown, where, f"a table ([{where}.stages.<stage>]), got "
                        f"{type(body).__name__}")
    for key in body:
        if key in _BASE_ONLY:
            raise SpecError(shown, f"{where}.{key}", f"not overridable: a variant changes "
                            f"stage parameters only ([{where}.stages.<stage>]); [{key}] is "
                            f"the base model's")
        if key != "stages":
            raise SpecError(shown, f"{where}.{key}", "unknown key (expected one of: stages)")
    stages = body.get("stages", {})
    if not isinstance(stages, dict):
        raise SpecError(shown, f"{where}.stages", f"a table of stages, got "
                        f"{type(stages).__name__}")
    return VariantTables(name, stages)


def merge_stages(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The base's stage tables with a variant's keys on top (a stage table the variant does
    not name, or a parameter it does not set, is the base's). A non-table override is kept
    as is, for the stage validation to reject with its own key path."""
    merged = dict(base)
    for stage, table in overrides.items():
        below = base.get(stage, {})
        both = isinstance(table, dict) and isinstance(below, dict)
        merged[stage] = {**below, **table} if both else table
    return merged
