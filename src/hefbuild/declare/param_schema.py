"""A target's parameter declarations (`[stages.params.<name>]` in `targets/<name>.toml`):
type, default, bounds, choices, the bool parameter that switches it on (`when`) or the values
of another parameter under which the rule reads it (`applies`), the stage it inherits its
value from, and the one line docs/parameters.md shows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import SpecError
from .declfile import _only_keys, one_of, string
from .params import ParamDef, check_value
from .params import ParamType as T

PARAM_TYPES = {"int": T.INT, "float": T.FLOAT, "bool": T.BOOL, "str": T.STR,
               "str_list": T.STR_LIST, "file": T.FILE, "duration": T.DURATION, "size": T.SIZE}
_PARAM_KEYS = {"type", "default", "min", "max", "choices", "when", "applies", "inherit", "doc"}


def parse_params(value: Any, where: str, shown: str,
                 reserved: set[str]) -> dict[str, ParamDef]:
    """A stage's `[stages.params]`: typed parameters; `reserved` names are every stage's."""
    if not isinstance(value, dict):
        raise SpecError(shown, where, f"a table of parameters, got {value!r}"[:120])
    params: dict[str, ParamDef] = {}
    for name, table in value.items():
        if name in reserved:
            raise SpecError(shown, f"{where}.{name}", "a name of its own (toolchain, timeout, "
                            "memory and gpu are every stage's)")
        if not isinstance(table, dict):
            raise SpecError(shown, f"{where}.{name}", "a table (type, default, doc, ...)")
        params[name] = _param(table, f"{where}.{name}", shown)
    for name, p in params.items():
        if p.when is not None and (p.when not in params or params[p.when].type is not T.BOOL):
            raise SpecError(shown, f"{where}.{name}.when",
                            f"a bool parameter of the same stage, got {p.when!r}")
        applies = _applies(value[name].get("applies"), params, f"{where}.{name}.applies", shown)
        if applies:
            params[name] = replace(p, applies=applies)
    return params


def _applies(value: Any, params: dict[str, ParamDef], where: str,
             shown: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """`applies = { method = ["static_qdq"] }`: each named parameter of the same stage, with
    a non-empty list of values it can take."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise SpecError(shown, where, "a table naming parameters of the same stage and the "
                        f"values under which this one is read, got {value!r}"[:160])
    out = []
    for other, values in value.items():
        if other not in params:
            raise SpecError(shown, f"{where}.{other}", one_of("a parameter of the same stage",
                                                              sorted(params), other))
        if not isinstance(values, list) or not values:
            raise SpecError(shown, f"{where}.{other}", f"a non-empty list of values, got "
                            f"{values!r}"[:120])
        for v in values:
            problem = check_value(v, params[other])
            if problem:
                raise SpecError(shown, f"{where}.{other}", f"values {other} can take: {problem}")
        out.append((other, tuple(values)))
    return tuple(out)


def _param(table: dict[str, Any], where: str, shown: str) -> ParamDef:
    _only_keys(table, _PARAM_KEYS, shown, where)
    kind = table.get("type")
    if kind not in PARAM_TYPES:
        raise SpecError(shown, f"{where}.type", one_of("one of", list(PARAM_TYPES), kind))
    ptype = PARAM_TYPES[kind]
    bounds = {}
    for key in ("min", "max"):
        bound = table.get(key)
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))):
            raise SpecError(shown, f"{where}.{key}", f"a number, got {bound!r}")
        bounds[key] = bound
    choices = table.get("choices", [])
    if not isinstance(choices, list):
        raise SpecError(shown, f"{where}.choices", f"a list, got {choices!r}")
    pdef = ParamDef(ptype, None, tuple(choices), minimum=bounds["min"], maximum=bounds["max"],
                    when=_optstring(table, "when", where, shown),
                    inherit=_optstring(table, "inherit", where, shown),
                    doc=string(table, "doc", shown, where))
    for choice in choices:
        problem = check_value(choice, ParamDef(ptype))
        if problem:
            raise SpecError(shown, f"{where}.choices", f"each {problem}")
    if "default" in table:
        problem = check_value(table["default"], pdef)
        if problem:
            raise SpecError(shown, f"{where}.default", f"expected {problem}")
        pdef = ParamDef(ptype, table["default"], pdef.choices, minimum=pdef.minimum,
                        maximum=pdef.maximum, when=pdef.when, inherit=pdef.inherit,
                        doc=pdef.doc)  # `applies` is added once every parameter is known
    return pdef


def _optstring(table: dict[str, Any], key: str, where: str, shown: str) -> str | None:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise SpecError(shown, f"{where}.{key}", f"a name, got {value!r}")
    return value
