"""The preflight in doit's terms (engine/preflight.py decides): once per run, before doit
dispatches its first task, the stage tasks a missing toolchain blocks are rewired.

A root (the first blocked task of its chain) loses its task_dep and its uptodate check and
fails at once with its toolchain's fix; a task after a root keeps only its blocked task_dep,
so doit blocks it as after any failure. What only blocked tasks needed is then reached by no
task and never runs (no hours of export for a parse that cannot start), while a stage that a
buildable task needs is still reached through it. Other models are left alone (doit runs
with `continue`). doit reads `task_dep` when it dispatches a task, after the reporter's
`initialize`, which is where this runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engine.preflight import Blocked, blocked, may_run, refusal_text, toolchain_problem
from ..execute.reach import tcp_problem
from ..execute.toolchain import ToolchainResolver
from .session import actions_at, fast_path_at, forced, project_at, table_at


@dataclass(frozen=True)
class Refused:
    blocked: Blocked
    message: str  # the run's one error: each missing toolchain, its fix, who needs it


def preflight(root: str, tasks: Mapping[str, Any], stages: set[str],
              argv: list[str]) -> Refused | None:
    """Check the toolchains of the stage tasks of this run (`stages`, doit's Task objects
    in `tasks`) that may run; rewire the blocked ones. None when nothing is missing."""
    deps = {t: [u for u in tasks[t].task_dep if u in stages] for t in stages}
    answer, toolchain_of = fast_path_at(root).answer, table_at(root).toolchain_of
    always = {t for t in stages if forced(t, argv)}  # `doit -a` reruns these: not fresh

    def fresh(task: str) -> bool:
        return task not in always and answer(task, toolchain_of(task)) is not None

    may = may_run(deps, fresh)
    _known_uptodate(tasks, stages - may)
    if not may:
        return None  # a no-op: nothing to check
    project, actions = project_at(root), actions_at(root)
    resolver = ToolchainResolver(project.paths.state / "toolchains.json",
                                 project.paths.toolchains)
    # On a cluster the device node, not this machine, connects to a device host.
    reach = None if project.settings.executor.kind == "ray" else tcp_problem
    problems = {tc: toolchain_problem(project.toolchains[tc], resolver, reach)
                for tc in sorted({actions[t].toolchain for t in may})}
    bad = {t: problems[actions[t].toolchain] for t in may if problems[actions[t].toolchain]}
    if not bad:
        return None
    needs: dict[str, list[str]] = {}
    for task in (t for t in actions if t in bad):  # in the plan's order: each chain's own
        needs.setdefault(actions[task].toolchain, []).append(task)
    result = blocked(deps, bad)
    _rewire(root, tasks, result)
    return Refused(result, refusal_text({tc: p for tc, p in problems.items() if p}, needs))


def _known_uptodate(tasks: Mapping[str, Any], fresh: set[str]) -> None:
    """The tasks whose last verdict holds, with every task before them, stay up to date in
    this run (nothing they read is rebuilt first): doit is told so with a plain True, as
    the uptodate check would answer it from the same verdict (asked again, the fast path
    gives the answer it gave here), without a call and a signature inspection per task."""
    for name in fresh:
        tasks[name].uptodate = [(True, None, None)]  # as doit keeps a bool


def _rewire(root: str, tasks: Mapping[str, Any], result: Blocked) -> None:
    every = result.tasks
    for name, why in result.roots.items():
        task = tasks[name]
        task.task_dep = []  # its upstream is not built for a stage that cannot start
        task.uptodate = []  # never up to date: without its toolchain it has no key
        task.actions[0].args = [root, name, why]  # run_task(root, task, refused)
    for name in result.downstream:
        task = tasks[name]
        task.task_dep = [d for d in task.task_dep if d in every]
