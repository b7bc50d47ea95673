"""Rendering of the DFC model-script templates (`rules/hailo/recipes/*.alls`).

A template is a DFC `.alls` model script with three additions, resolved here before the
script is handed to `ClientRunner.load_model_script`:

* `{name}` / `{name.field}` placeholders: replaced by the value from the rule's context
  (ints and strings verbatim, booleans as `True`/`False`). Only identifier-shaped braces are
  placeholders; DFC's own brace syntax (e.g. the glob `{*}`) is left untouched. A placeholder
  the context does not define is an error naming it, the template file and the line.
* line guards `[if NAME]` / `[unless NAME]` at the start of a line: the line is kept only
  when the boolean NAME is true / false.
* `[each NAME] ...`: the line is repeated once per item of the list NAME, in list order;
  `{NAME}` is the item, `{NAME.field}` a field of an item that is a mapping. An empty list
  renders no line. A list can only be used through `[each ...]`.

Whole-line comments (`#` first) and blank lines document the template and are not rendered,
so the rendered script holds exactly the commands that were loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\}")
PREFIX = re.compile(r"^\s*\[(if|unless|each)\s+([A-Za-z_][A-Za-z0-9_]*)\]\s*")


class ScriptError(ValueError):
    """A template that cannot be rendered; the message names the file and the line."""


def _scalar(value: Any, where: str, name: str) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    raise ScriptError(f"placeholder {{{name}}} at {where} is a {type(value).__name__}, not a "
                      "scalar (lists are used through an '[each ...]' line)")


def _lookup(name: str, context: Mapping[str, Any], where: str) -> Any:
    head, _, field = name.partition(".")
    if head not in context:
        raise ScriptError(f"unresolved placeholder {{{name}}} at {where} (known: "
                          f"{', '.join(sorted(context))})")
    value = context[head]
    if field:
        if not isinstance(value, Mapping) or field not in value:
            raise ScriptError(f"unresolved placeholder {{{name}}} at {where}: "
                              f"'{head}' has no field '{field}'")
        value = value[field]
    return value


def _substitute(text: str, context: Mapping[str, Any], where: str) -> str:
    return PLACEHOLDER.sub(
        lambda m: _scalar(_lookup(m.group(1), context, where), where, m.group(1)), text)


def render(template: str, context: Mapping[str, Any], source: str) -> str:
    """The rendered script (one command per line, trailing newline); `source` names the
    template in error messages."""
    out: list[str] = []
    for number, raw in enumerate(template.splitlines(), start=1):
        where = f"{source}:{number}"
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        line, items, each = raw, None, None
        while (m := PREFIX.match(line)) is not None:
            kind, name = m.group(1), m.group(2)
            line = line[m.end():]
            if name not in context:
                raise ScriptError(f"unresolved placeholder [{kind} {name}] at {where} (known: "
                                  f"{', '.join(sorted(context))})")
            value = context[name]
            if kind == "each":
                if each is not None:
                    raise ScriptError(f"two [each ...] prefixes at {where}")
                if not isinstance(value, (list, tuple)):
                    raise ScriptError(f"[each {name}] at {where}: '{name}' is not a list")
                each, items = name, list(value)
            else:
                if not isinstance(value, bool):
                    raise ScriptError(f"[{kind} {name}] at {where}: '{name}' is not a boolean")
                if value != (kind == "if"):
                    items = []
                    break
        if items is not None and not items:
            continue
        if each is None:
            out.append(_substitute(line.rstrip(), context, where))
            continue
        for item in items:
            out.append(_substitute(line.rstrip(), {**context, each: item}, where))
    return "\n".join(out) + "\n"


def commands(script: str) -> list[str]:
    """Non-blank, non-comment lines of a rendered script, stripped."""
    return [ln.strip() for ln in script.splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]
