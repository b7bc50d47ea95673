"""What each task and each model of a run came to, as the terminal shows it.

Pure: the reporter hands in task names, their values and failure messages; nothing here
reads doit's state (which groups are checks comes in as `Checks`, from the targets). A
group run (a target's check or artifact group, the default tasks) ends with a table, one
row per model: passed, failed (why), or not runnable (why, and the command that
fixes it when the error names one), so one broken model never hides how the others did.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..declare.checks import Checks, builtin_checks
from ..engine.verdicts import check_verdict
from .summary import human_bytes, human_seconds

_LABEL_WIDTH = 10
# What the table's row already says: the task, and the rule that failed or the preflight
# that kept it from starting (cli/preflight.py).
_RULE_PREFIX = re.compile(r"^\S+: (rules/\S+ failed \(exit \d+\)|not started): ")
_LOG_SUFFIX = re.compile(r"; log: build/\S+$")


def task_line(task: str, values: dict[str, Any], count: str = "") -> str:
    """`built      export:m  12.3 s, peak 812 MiB — params.samples 32 → 16` and the like;
    `count` (`[3/12] `) leads the line when a run shows more than one stage."""
    outcome = values.get("outcome", "")
    why = f" — {values['why']}" if values.get("why") else ""
    if outcome == "uptodate":
        return labelled("up to date", task, count) + why
    seconds = float(values.get("seconds", 0.0))
    detail = human_seconds(seconds)
    if outcome == "built" and values.get("peak_rss_mb"):
        detail += f", peak {values['peak_rss_mb']:.0f} MiB"
    if outcome == "built" and values.get("node"):
        detail += f", on {values['node']}"
    elif outcome == "remote":
        detail = (f"{human_bytes(values.get('bytes', 0))} in "
                  f"{float(values.get('remote_seconds', 0.0)):.2f} s, verified")
    if values.get("env_s"):  # not in the stage's time: said beside it
        detail += (f" (after {human_seconds(float(values['env_s']))} getting venv toolchain "
                   f"{values.get('env', '')} ready)")
    return labelled(outcome, f"{task}  {detail}", count) + why


def progress(done: int, total: int) -> str:
    """`[ 3/12] `: how far a run of `total` stages is; nothing for a run of one."""
    return f"[{done:>{len(str(total))}}/{total}] " if total > 1 else ""


def blocked_line(blocked: list[str], shown: int = 6) -> str:
    """One line for every task that did not start because an upstream one failed."""
    if not blocked:
        return ""
    names = ", ".join(blocked[:shown]) + (f", … ({len(blocked) - shown} more)"
                                          if len(blocked) > shown else "")
    return labelled("not run", f"{len(blocked)} task{'s' if len(blocked) != 1 else ''} "
                               f"after a failure upstream: {names}")


def labelled(label: str, text: str, count: str = "") -> str:
    return f"{count or '   '}{label:<{_LABEL_WIDTH}} {text}"


def members(selected: list[str], known: list[str], checks: Checks | None = None) -> list[str]:
    """The check and artifact tasks a run's table covers: every member of a named group,
    and each such task named alone when more than one is."""
    groups = (checks or builtin_checks()).groups
    wanted: list[str] = []
    for name in selected:
        if name in groups:
            wanted += sorted(t for t in known if t.startswith(f"{name}:"))
        elif name.split(":", 1)[0] in groups:
            wanted.append(name)
    named_group = any(n in groups for n in selected)
    return list(dict.fromkeys(wanted)) if named_group or len(wanted) > 1 else []


@dataclass(frozen=True)
class Row:
    task: str
    status: str  # passed | built | failed | not runnable | not run
    why: str


def rows(root: Path, wanted: list[str], succeeded: set[str], failed: dict[str, str],
         blocked: set[str], broken: dict[str, str], groups: list[str],
         checks: Checks | None = None,
         verdict_of: Callable[[str], str] | None = None) -> list[Row]:
    """`verdict_of`: a succeeded check's one-line verdict as this run already said it (the
    reporter has it from the fast path's note); without it, or where it has none, the
    verdict is read from the check's report."""
    checks = checks or builtin_checks()
    table = [_row(root, t, succeeded, failed, blocked, checks, verdict_of) for t in wanted]
    table += [Row(f"{g}:{m}", "not runnable", error)
              for g in groups for m, error in sorted(broken.items())]
    return table


def _row(root: Path, task: str, succeeded: set[str], failed: dict[str, str],
         blocked: set[str], checks: Checks,
         verdict_of: Callable[[str], str] | None = None) -> Row:
    group, model = task.split(":", 1)
    if task in succeeded:
        if group in checks.stages:
            said = verdict_of(task) if verdict_of is not None else ""
            verdict = (said or check_verdict(root, task, checks=checks)).removeprefix(
                f"{task}: ")
            status = "passed" if verdict.startswith("passed") else "failed"
            head, _, figures = verdict.partition(", ")
            double = head.removeprefix("passed").removeprefix("FAILED").strip()
            return Row(task, status, f"{double}: {figures}" if double else figures)
        return Row(task, "built", f"build/{model}/{checks.artifacts.get(group, group)}")
    if task in failed:
        if check_verdict(root, task, failed=True, checks=checks):
            return Row(task, "failed", reason(failed[task]))
        return Row(task, "not runnable", reason(failed[task]))
    upstream = [(t, m) for t, m in failed.items() if t.split(":", 1)[-1] == model]
    if task in blocked and upstream:
        first, message = upstream[0]
        return Row(task, "not runnable", f"{first} failed: {reason(message)}")
    return Row(task, "not run", "")


def reason(message: str) -> str:
    """A failure line without what the table already says (task, rule, log path)."""
    text = _LOG_SUFFIX.sub("", _RULE_PREFIX.sub("", message.strip()))
    return text.split("\n", 1)[0]


def table_lines(table: list[Row], checks: Checks | None = None) -> list[str]:
    if not table:
        return []
    checks = checks or builtin_checks()
    width = max(len(r.task) for r in table)
    lines = ["checks:" if all(checks.stage_of(r.task) for r in table) else "models:"]
    for r in table:
        lines.append(f"   {r.status:<12} {r.task:<{width}}  {r.why}".rstrip())
    counts: dict[str, int] = {}
    for r in table:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append("   " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return lines
