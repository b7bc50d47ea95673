"""Typed parameters: what a stage accepts, and checking a declared value against it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .declfile import _only_keys
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
    ok = {
        ParamType.INT: isinstance(value, int) and not isinstance(value, bool),
        ParamType.FLOAT: isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
        ParamType.BOOL: isinstance(value, bool),
        ParamType.STR: isinstance(value, str),
        ParamType.FILE: isinstance(value, str) and value != "",
        ParamType.STR_LIST: isinstance(value, list) and all(isinstance(v, str) for v in value),
        ParamType.DURATION: _parses(parse_duration, value),
        ParamType.SIZE: _parses(parse_size, value),
    }[ptype]
    return None if ok else f"{ptype.value}, got {_describe(value)}"


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


def check_params(
    table: dict[str, Any], schema: dict[str, ParamDef], shown: str, path: str, root: Path,
    model: str = "",
) -> dict[str, Any]:
    """Validate `table` against `schema`; return it with defaults filled in.

    A FILE default may name the model as `{model}` (e.g. `placements/{model}.auto.alls`).
    """
    _only_keys(table, schema, shown, path)
    resolved: dict[str, Any] = {}
    for key, pdef in schema.items():
        if key not in table:
            if pdef.required:
                raise SpecError(shown, f"{path}.{key}", f"required: {pdef.type.value}")
            if pdef.default is not None:
                default = pdef.default
                if pdef.type is ParamType.FILE:
                    default = default.format(model=model)
                resolved[key] = default
            continue
        problem = check_value(table[key], pdef)
        if problem:
            raise SpecError(shown, f"{path}.{key}", f"expected {problem}")
        resolved[key] = normalize(table[key], pdef)
    for key, pdef in schema.items():
        if pdef.when is not None and not resolved.get(pdef.when):
            resolved.pop(key, None)
    for key, pdef in schema.items():
        if pdef.type is ParamType.FILE and key in resolved:
            check_project_file(resolved[key], root, shown, f"{path}.{key}")
    return resolved


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
