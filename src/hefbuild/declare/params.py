"""Typed parameters: what a stage accepts, and checking a declared value against it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .declfile import _only_keys
from .mistakes import Mistakes
from .names import fits_name_max
from .names import shown as shown_name


class ParamType(Enum):
    INT = "an integer"
    FLOAT = "a number"
    BOOL = "true or false"
    STR = "a string"
    STR_LIST = "a list of strings"
    FILE = "a project-relative file path"  # its content digest enters the key
    DURATION = "a duration like \"90s\", \"15m\", \"6h\" (or seconds)"
    SIZE = "a size like \"512m\", \"24g\" (or bytes)"


@dataclass(frozen=True)
class ParamDef:
    type: ParamType
    default: Any = None
    choices: tuple[Any, ...] = ()
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    # The name of a BOOL parameter that switches this one on; while it is false this one
    # is dropped entirely (not checked, not in the key).
    when: str | None = None
    # (name, values): this one is read only while that parameter has one of those values
    # (`applies = { method = ["static_qdq"] }`); otherwise it is dropped as with `when`.
    applies: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    # A stage whose value, when this one is not given, is taken over (fidelity calibrates on
    # optimize's rows unless told otherwise).
    inherit: str | None = None
    doc: str = ""  # one line for the parameter reference (docs/parameters.md)


def check_value(value: Any, pdef: ParamDef) -> str | None:
    """None when `value` fits `pdef`, else what was expected (for the error line)."""
    expected = _type_error(value, pdef.type)
    if expected:
        return expected
    if pdef.choices and value not in pdef.choices:
        return "one of " + ", ".join(repr(c) for c in pdef.choices) + \
            f", got {safe_repr(value)}"
    if pdef.type is ParamType.STR_LIST:
        if pdef.minimum is not None and len(value) < pdef.minimum:
            return f"a list of at least {pdef.minimum:g} strings, got {safe_repr(value)}"
        return None
    if pdef.minimum is not None and value < pdef.minimum:
        return f"{pdef.type.value} >= {pdef.minimum}"
    if pdef.maximum is not None and value > pdef.maximum:
        return f"{pdef.type.value} <= {pdef.maximum}"
    return None


def _type_error(value: Any, ptype: ParamType) -> str | None:
    return None if _FITS[ptype](value) else f"{ptype.value}, got {_describe(value)}"


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {safe_repr(value)}"


def safe_repr(value: Any) -> str:
    """A short repr, even of a value nested thousands deep."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, 40, 40
    return short.repr(value)[:60]


def normalize(value: Any, pdef: ParamDef) -> Any:
    """One spelling per value: a FLOAT given as `1` is `1.0`; durations in seconds and
    sizes in bytes."""
    if pdef.type is ParamType.FLOAT:
        return float(value)
    if pdef.type is ParamType.DURATION:
        return parse_duration(value)
    if pdef.type is ParamType.SIZE:
        return parse_size(value)
    return value


_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNITS_B = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_duration(value: Any) -> float:
    return _with_unit(value, _UNITS_S, float)


def parse_size(value: Any) -> int:
    return int(_with_unit(value, _UNITS_B, int))


def _with_unit(value: Any, units: dict[str, int], number: type) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        result = float(value)
    else:
        text = str(value).strip().lower().removesuffix("b").removesuffix("i")
        unit = units.get(text[-1:])
        result = float(text[:-1]) * unit if unit else float(text)
    if not result > 0 or not math.isfinite(result):  # nan, inf: no duration or size
        raise ValueError(value)
    return number(result) if number is int else result


def _parses(parse: Any, value: Any) -> bool:
    try:
        parse(value)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


# One check per type, run alone: every value of every model passes through here.
_FITS: dict[ParamType, Any] = {
    ParamType.INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    ParamType.FLOAT: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    and math.isfinite(v),
    ParamType.BOOL: lambda v: isinstance(v, bool),
    ParamType.STR: lambda v: isinstance(v, str),
    ParamType.FILE: lambda v: isinstance(v, str) and v != "",
    ParamType.STR_LIST: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    ParamType.DURATION: lambda v: _parses(parse_duration, v),
    ParamType.SIZE: lambda v: _parses(parse_size, v),
}


def check_params(
    table: dict[str, Any], schema: dict[str, ParamDef], shown: str, path: str, root: Path,
    model: str = "",
) -> dict[str, Any]:
    """Validate `table` against `schema`; return it with defaults filled in.

    A FILE default may name the model as `{model}` (e.g. `placements/{model}.auto.alls`).
    """
    mistakes = Mistakes()
    with mistakes.check():
        _only_keys(table, schema, shown, path)
    resolved: dict[str, Any] = {}
    for key, pdef in schema.items():
        with mistakes.check():
            value = _resolved(key, table, pdef, shown, path, model)
            if value is not None:
                resolved[key] = value
    for key in unread(schema, resolved):
        resolved.pop(key)
    for key, pdef in schema.items():
        if pdef.type is ParamType.FILE and key in resolved:
            with mistakes.check():
                check_project_file(resolved[key], root, shown, f"{path}.{key}")
    mistakes.raise_any()
    return resolved


def _resolved(key: str, table: dict[str, Any], pdef: ParamDef, shown: str, path: str,
              model: str) -> Any:
    """The key's value (normalized), its default, or None when it has neither."""
    if key not in table:
        if pdef.required:
            raise SpecError(shown, f"{path}.{key}", f"required: {pdef.type.value}")
        if pdef.default is not None and pdef.type is ParamType.FILE:
            return pdef.default.format(model=model)
        return pdef.default
    problem = check_value(table[key], pdef)
    if problem:
        raise SpecError(shown, f"{path}.{key}", f"expected {problem}")
    return normalize(table[key], pdef)


def unread(schema: dict[str, ParamDef], resolved: dict[str, Any]) -> list[str]:
    """The parameters no rule reads with these values: a `when` switch that is off, or an
    `applies` condition that does not hold (nor does it when what it names is itself
    unread). They leave the key, so changing one rebuilds nothing."""
    dropped: list[str] = []
    changed = True
    while changed:
        changed = False
        for key, pdef in schema.items():
            if key in resolved and key not in dropped and not _applies(pdef, resolved, dropped):
                dropped.append(key)
                changed = True
    return dropped


def conditions(pdef: ParamDef) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """What must hold for a rule to read the parameter: `when = "x"` is `x = true`."""
    return pdef.applies + (((pdef.when, (True,)),) if pdef.when is not None else ())


def _applies(pdef: ParamDef, resolved: dict[str, Any], dropped: list[str]) -> bool:
    return all(name not in dropped and resolved.get(name) in values
               for name, values in conditions(pdef))


def condition_text(pdef: ParamDef) -> str:
    """`method = "static_qdq" or "dynamic_int8"`: what makes a rule read the parameter."""
    return " and ".join(f"{name} = " + " or ".join(shown_value(v) for v in values)
                        for name, values in conditions(pdef))


def shown_value(value: Any) -> str:
    """A value as it is written in TOML (None: not set)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def check_project_file(value: str, root: Path, shown: str, key: str) -> None:
    rel = Path(value)
    if rel.is_absolute() or ".." in rel.parts:
        raise SpecError(shown, key, f"a path inside the project, relative to its root, "
                        f"got {value!r}")
    if not fits_name_max(value):  # else stat() raises ENAMETOOLONG
        raise SpecError(shown, key, f"a path whose every part fits the file system's limit, "
                        f"got {shown_name(value)}")
    if not (root / rel).is_file():
        raise SpecError(shown, key, f"file {value!r} does not exist (paths are project-relative)")
    real = (root / rel).resolve()
    if not real.is_relative_to(root.resolve()):
        raise SpecError(shown, key, f"a file inside the project, got {value!r}, a link to a "
                        f"file outside it")
