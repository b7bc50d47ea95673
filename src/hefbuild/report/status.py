"""`doit status`: every model × stage at a glance, then why each task that would change.

Pure formatting of `explain.TaskStatus` verdicts (the ones `doit explain` gives), so the
grid, the explanations and what a build then does cannot disagree.
"""

from __future__ import annotations

from .explain import AFTER, BUILD, FAILED, NEVER, REFUSED, RESTORE, UPTODATE, TaskStatus

CELL = {UPTODATE: "ok", RESTORE: "restore", BUILD: "BUILD", NEVER: "new", AFTER: "after",
        REFUSED: "REFUSED", FAILED: "FAILED"}
RUNNING = "running"
REMOTE = "remote"  # up to date, its bytes in the remote cache only (download = "minimal")


def grid(models: dict[str, tuple[str, list[TaskStatus]]], running: dict[str, str]) -> list[str]:
    """One block per target (their stages differ): a header row of stage names, one row per
    model. `models`: name -> (target, statuses in stage order); `running`: task -> log."""
    lines: list[str] = []
    by_target: dict[str, list[str]] = {}
    for name, (target, _) in models.items():
        by_target.setdefault(target, []).append(name)
    for target, names in by_target.items():
        stages = [s.task.split(":", 1)[0] for s in models[names[0]][1]]
        width = max(len(n) for n in [*names, target])
        cols = [max(len(st), 7) for st in stages]
        lines.append(f"{target:<{width}}  " + "  ".join(
            f"{st:<{w}}" for st, w in zip(stages, cols, strict=True)))
        for name in names:
            cells = [RUNNING if s.task in running else _cell(s) for s in models[name][1]]
            lines.append(f"{name:<{width}}  " + "  ".join(
                f"{c:<{w}}" for c, w in zip(cells, cols, strict=True)).rstrip())
        lines.append("")
    return lines


def details(statuses: list[TaskStatus], running: dict[str, str]) -> list[str]:
    """Why each task that is not up to date would change, and where a running one logs;
    tasks that wait for an upstream are named once per model, after it."""
    lines = []
    waiting: dict[str, list[str]] = {}
    for s in statuses:
        if s.task in running:
            lines.append(f"   {s.task}: running; follow it: tail -f {running[s.task]}")
        if s.kind == AFTER:
            waiting.setdefault(s.upstream, []).append(s.task.split(":", 1)[0])
            continue
        if s.kind == UPTODATE:
            if s.in_remote:
                lines.append(f"   {s.task}: up to date, in the remote cache (not in build/: "
                             f"{', '.join(s.in_remote)}; `doit fetch {s.task}` brings them)")
            continue
        text = {RESTORE: f"would restore from the store ({s.reason})",
                BUILD: f"would build: {s.reason}",
                NEVER: f"never built: {s.reason}",
                REFUSED: f"refused: {s.reason}",
                FAILED: f"failed: {s.reason}"}[s.kind]
        lines.append(f"   {s.task}: {text}")
    for upstream, stages in waiting.items():
        lines.append(f"   then, after {upstream}: {', '.join(stages)} (each rebuilt only if "
                     f"its inputs come out different)")
    return lines


def totals(statuses: list[TaskStatus]) -> str:
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.kind] = counts.get(s.kind, 0) + 1
    order = (UPTODATE, RESTORE, BUILD, NEVER, FAILED, AFTER, REFUSED)
    remote = sum(1 for s in statuses if s.kind == UPTODATE and s.in_remote)
    return ", ".join(f"{counts[k]} {k}" + (f" ({remote} in the remote cache)"
                                           if k == UPTODATE and remote else "")
                     for k in order if counts.get(k)) or "no tasks"


def _cell(status: TaskStatus) -> str:
    """An up-to-date stage whose bytes stayed in the remote cache says so."""
    return REMOTE if status.kind == UPTODATE and status.in_remote else CELL[status.kind]


def task_rows(statuses: list[TaskStatus], running: dict[str, str]) -> list[str]:
    """One line per task, for tasks named on the command line (not whole models): its
    cell, and why when it would change."""
    if not statuses:
        return []
    width = max(len(s.task) for s in statuses)
    lines = []
    for s in statuses:
        cell = RUNNING if s.task in running else _cell(s)
        why = "" if s.kind == UPTODATE else s.reason
        if s.kind == UPTODATE and s.in_remote:
            why = f"in the remote cache (not in build/: {', '.join(s.in_remote)})"
        if s.kind == AFTER:
            why = f"after {s.upstream}: {s.reason}"
        lines.append(f"{s.task:<{width}}  {cell:<7}  {why}".rstrip())
    return lines
