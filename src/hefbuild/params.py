"""Typed parameters: what a stage accepts, and checking a declared value against it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class ParamType(Enum):
    INT = "an integer"
    FLOAT = "a number"
    BOOL = "true or false"
    STR = "a string"
    STR_LIST = "a list of strings"
    FILE = "a project-relative file path"  # its content digest enters the key


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


def check_value(value: Any, pdef: ParamDef) -> str | None:
    """None when `value` fits `pdef`, else what was expected (for the error line)."""
    expected = _type_error(value, pdef.type)
    if expected:
        return expected
    if pdef.choices and value not in pdef.choices:
        return "one of " + ", ".join(repr(c) for c in pdef.choices)
    if pdef.minimum is not None and value < pdef.minimum:
        return f"{pdef.type.value} >= {pdef.minimum}"
    if pdef.maximum is not None and value > pdef.maximum:
        return f"{pdef.type.value} <= {pdef.maximum}"
    return None


def _type_error(value: Any, ptype: ParamType) -> str | None:
    ok = {
        ParamType.INT: isinstance(value, int) and not isinstance(value, bool),
        ParamType.FLOAT: isinstance(value, (int, float)) and not isinstance(value, bool),
        ParamType.BOOL: isinstance(value, bool),
        ParamType.STR: isinstance(value, str),
        ParamType.FILE: isinstance(value, str) and value != "",
        ParamType.STR_LIST: isinstance(value, list) and all(isinstance(v, str) for v in value),
    }[ptype]
    return None if ok else f"{ptype.value}, got {_describe(value)}"


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:60]


def normalize(value: Any, pdef: ParamDef) -> Any:
    """One spelling per value in keys: a FLOAT given as `1` is the same as `1.0`."""
    if pdef.type is ParamType.FLOAT:
        return float(value)
    return value
