"""What a stage is doing, read from its log lines: a generic matcher over a declared table.

The heartbeat names the latest phase a stage's log announced (`phase: placement of
<group> (since 42 min)`), so a compile that has been quiet for an hour can be told apart
from one that hangs. Lines that match nothing leave the phase as it was.

The table is data: a target declares it (`[watch]` and `[[watch.phases]]` in its
`targets/<name>.toml`, loaded by declare/targets.py) and the engine hands it to the watch of
that target's stages; a target that declares none gets no phase.

- Each rule: a regular expression, the phase it names, an optional detail (a format string
  over the pattern's named groups; groups listed in `lower` are shown in lower case) and
  `step`: a step of placement, which stays under the group being placed.
- `group`: a pattern whose named group `group` (and optional `ctx`) names a network group;
  a line naming one that also matches `placing` starts `placement of <group>`, and the
  placement steps after it stay under that group until the next phase.
- `keywords`: every rule's line holds one of them; one search rejects the other lines (most
  of a log) at a fraction of the table's cost. Empty: every line is matched.

First match wins, so a table lists its specific lines before its general ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .declfile import _only_keys, names, string, table_list

PLACEMENT = "placement of "


@dataclass(frozen=True)
class Phase:
    name: str
    detail: str = ""  # the step within the phase; a new detail does not restart the clock

    @property
    def text(self) -> str:
        return f"{self.name}, {self.detail}" if self.detail else self.name


@dataclass(frozen=True)
class PhaseRule:
    pattern: re.Pattern[str]
    name: str
    detail: str = ""  # a format string over the pattern's named groups
    step: bool = False  # a step of placement: stays under the network group being placed


@dataclass(frozen=True)
class PhaseTable:
    rules: tuple[PhaseRule, ...] = ()
    keywords: tuple[str, ...] = ()  # lower case
    lower: tuple[str, ...] = ()  # captured prose, shown in lower case
    group: re.Pattern[str] | None = None
    placing: re.Pattern[str] | None = None


def line_phase(table: PhaseTable, line: str) -> tuple[Phase, bool] | None:
    """The phase one log line announces, and whether it is a step of placement."""
    for rule in table.rules:
        m = rule.pattern.search(line)
        if m:
            values = {k: (v or "").lower() if k in table.lower else (v or "")
                      for k, v in m.groupdict().items()}
            return Phase(rule.name, rule.detail.format(**values)), rule.step
    return None


def group_phase(table: PhaseTable, line: str) -> Phase | None:
    """The phase `placement of <group>`, when the line is about placing a network group."""
    if table.group is None:
        return None
    m = table.group.search(line)
    if m is None or (table.placing is not None and not table.placing.search(line)):
        return None
    ctx = m.groupdict().get("ctx")
    return Phase(PLACEMENT + m["group"], f"context {ctx}" if ctx else "")


def next_phase(table: PhaseTable | None, current: Phase | None, line: str) -> Phase | None:
    """The phase after `line`: `current` when the line announces nothing."""
    if table is None:
        return current
    if table.keywords:
        low = line.lower()
        if not any(word in low for word in table.keywords):
            return current
    placing = group_phase(table, line)
    if placing is not None:
        return placing
    found = line_phase(table, line)
    if found is None:
        return current
    phase, step = found
    if step and current is not None and current.name.startswith(PLACEMENT):
        return Phase(current.name, phase.text)
    return phase


# -- the table as a target declares it (`[watch]`) -------------------------------------

_WATCH_KEYS = {"keywords", "lower", "group", "placing", "phases"}
_PHASE_KEYS = {"pattern", "phase", "detail", "step"}



def parse_watch(value: Any, shown: str) -> PhaseTable | None:
    """`[watch]`: the phase table. Rule patterns match case-insensitively; `group` and
    `placing` as written (use `(?i)` for that)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SpecError(shown, "watch", "a table (keywords, lower, group, placing, phases)")
    _only_keys(value, _WATCH_KEYS, shown, "watch")
    rules = tuple(_phase_rule(t, f"watch.phases[{i}]", shown)
                  for i, t in enumerate(table_list(value, "phases", shown)))
    words = {k: names(value, k, "watch", shown) for k in ("keywords", "lower")}
    group = _regex(value.get("group"), "watch.group", shown, 0)
    if group is not None and "group" not in group.groupindex:
        raise SpecError(shown, "watch.group", "a pattern with a named group (?P<group>...)")
    return PhaseTable(rules, tuple(w.lower() for w in words["keywords"]), words["lower"],
                      group, _regex(value.get("placing"), "watch.placing", shown, 0))


def _phase_rule(table: dict[str, Any], where: str, shown: str) -> PhaseRule:
    _only_keys(table, _PHASE_KEYS, shown, where)
    pattern = _regex(table.get("pattern"), f"{where}.pattern", shown, re.IGNORECASE)
    if pattern is None:
        raise SpecError(shown, f"{where}.pattern", "a regular expression")
    name = string(table, "phase", shown, where)
    if not name:
        raise SpecError(shown, f"{where}.phase", "the phase's name")
    detail = string(table, "detail", shown, where)
    try:
        detail.format(**{g: "" for g in pattern.groupindex})
    except (KeyError, IndexError, ValueError) as exc:
        raise SpecError(shown, f"{where}.detail", "a format string over the pattern's named "
                        f"groups ({', '.join(pattern.groupindex) or 'none'}), got {detail!r}"
                        f" ({exc!r})") from exc
    step = table.get("step", False)
    if not isinstance(step, bool):
        raise SpecError(shown, f"{where}.step", f"true or false, got {step!r}")
    return PhaseRule(pattern, name, detail, step)


def _regex(value: Any, where: str, shown: str, flags: int) -> re.Pattern[str] | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError(shown, where, f"a regular expression, got {value!r}")
    try:
        return re.compile(value, flags)
    except re.error as exc:
        raise SpecError(shown, where, f"a valid regular expression, got {value!r} "
                        f"({exc})") from exc
