"""Parameter groups: parameters several stages declare alike (a check's prompts and gates on
every target), written once in `targets/groups/<name>.toml` as `[params.<name>]` tables and
named by a stage's `param_groups = [...]`. A stage's own `[stages.params.<name>]` replaces a
group's parameter of that name (a stage may narrow one to what it can measure). A
project's own `targets/groups/` wins over hefbuild's, file by file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SpecError
from .declfile import _only_keys, names, one_of, read_toml
from .param_schema import parse_params

GROUPS_DIR = "groups"


def group_tables(table: dict[str, Any], where: str, shown: str, builtin: Path,
                 root: Path | None, reserved: set[str]) -> dict[str, Any]:
    """The raw `[params.*]` tables of the groups a stage names, in order, each group file
    checked on its own (its errors name it); a parameter in two groups is an error."""
    merged: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for group in names(table, "param_groups", where, shown):
        path = _find(group, builtin, root)
        if path is None:
            raise SpecError(shown, f"{where}.param_groups", one_of(
                f"a file {builtin.name}/{GROUPS_DIR}/<name>.toml", _available(builtin, root),
                group))
        gshown = f"{builtin.name}/{GROUPS_DIR}/{path.name}"
        doc = read_toml(path, gshown)
        _only_keys(doc, {"params"}, gshown, "")
        raw = doc.get("params", {})
        parse_params(raw, "params", gshown, reserved)
        for name in raw:
            if name in owner:
                raise SpecError(shown, f"{where}.param_groups", f"groups that do not share a "
                                f"parameter: {name!r} is in {owner[name]!r} and {group!r}")
            owner[name] = group
        merged.update(raw)
    return merged


def _folders(builtin: Path, root: Path | None) -> list[Path]:
    own = [root / builtin.name / GROUPS_DIR] if root is not None else []
    return own + [builtin / GROUPS_DIR]


def _find(group: str, builtin: Path, root: Path | None) -> Path | None:
    return next((p for f in _folders(builtin, root) if (p := f / f"{group}.toml").is_file()),
                None)


def _available(builtin: Path, root: Path | None) -> list[str]:
    return sorted({p.stem for f in _folders(builtin, root) if f.is_dir()
                   for p in f.glob("*.toml")})
