"""The run's preflight: before any stage starts, is every toolchain it will need ready?

A missing toolchain is found by the first stage that needs it, which in a compiler chain
may come after hours of the stages before it. So, once per run, the stages that may run (not
known up to date by the fast path, or downstream of one that is not) have their toolchains
checked exactly as their keys would check them (identity and pins: a docker toolchain's
image lock, a host toolchain's package versions, a venv toolchain's lock and base python),
plus one short connection to a device host over ssh. Every stage that needs a toolchain
that is not ready is blocked with the fix, together with what comes after it; the adapter
(cli/preflight.py) keeps doit from running what only the blocked stages need.

The graph functions here are pure (task names in, task names out); only
`toolchain_problem` looks at the machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import HefbuildError
from ..execute.reach import tcp_problem

if TYPE_CHECKING:
    from ..declare.toolchains import ToolchainSpec
    from ..execute.toolchain import ToolchainResolver

Deps = Mapping[str, Iterable[str]]  # stage task -> the stage tasks it waits for


def toolchain_problem(spec: ToolchainSpec, resolver: ToolchainResolver,
                      reach: Callable[[str, int], str] | None = tcp_problem) -> str:
    """What keeps a stage of `spec` from running here, with its fix; "" when nothing does.
    A docker image lock is checked, not the image in the local engine: a stage restored
    from the store needs no image, a cluster runs it elsewhere, and asking the engine would
    import the docker SDK on every run (the docker executor names a missing image itself).
    `reach` None: a device host is not tried (on a cluster the device node connects to it,
    not this machine)."""
    from ..plan.limits import device_target  # only a run that may run a stage gets here

    try:
        resolver.identity(spec)  # the key's own check: lock files, interpreters, probes
        resolver.check(spec)  # a host toolchain's pinned package versions
        device = device_target(spec) if spec.kind in ("ssh", "local") else None
    except HefbuildError as exc:
        text = str(exc)
        return text if text.startswith(spec.file) else f"{spec.file}: {text}"
    if device is None or device["kind"] != "ssh" or reach is None:
        return ""
    why = reach(device["host"], int(device["port"]))
    if not why:
        return ""
    named = "HEFBUILD_DEVICE" if os.environ.get("HEFBUILD_DEVICE", "").strip() else spec.file
    return (f"{named}: device host {device['host']}:{device['port']} does not answer ({why}); "
            f"switch it on and check the network, or point HEFBUILD_DEVICE at another "
            f"(ssh://user@host:port, or local)")


def may_run(deps: Deps, fresh: Callable[[str], bool]) -> set[str]:
    """The stage tasks of `deps` that may run in this run: one whose last verdict is not
    known to hold (`fresh` says; False for a task `doit -a` names), and every one after it
    (its inputs may change). A no-op run is all fresh: it checks no toolchain."""
    runs: dict[str, bool] = {}

    def visit(task: str) -> bool:
        known = runs.get(task)
        if known is not None:
            return known
        runs[task] = False  # a cycle is doit's to refuse; here it only must not recurse
        # Upstream first (every one of them): a task after one that may run is not asked,
        # so its inputs are not stat-ed (and cached by the fast path) before they are rebuilt.
        after_run = False
        for up in deps.get(task, ()):
            if up in deps and visit(up):
                after_run = True
        runs[task] = after_run or not fresh(task)
        return runs[task]

    return {t for t in deps if visit(t)}


@dataclass(frozen=True)
class Blocked:
    """The stage tasks a missing toolchain keeps from starting."""

    roots: dict[str, str]  # task -> why: the first of its chain that needs a missing one
    downstream: frozenset[str]  # after a root: doit blocks them as after any failed task

    @property
    def tasks(self) -> frozenset[str]:
        return frozenset(self.roots) | self.downstream


def blocked(deps: Deps, bad: Mapping[str, str]) -> Blocked:
    """`bad`: each task whose own toolchain is not ready -> the problem. Every task that
    needs one of them (itself or through its upstream) is blocked; the roots are those
    with no blocked upstream, so each chain fails once, at its first missing toolchain."""
    after: dict[str, list[str]] = {}
    for task, ups in deps.items():
        for up in ups:
            after.setdefault(up, []).append(task)
    out, todo = set(bad), list(bad)
    while todo:
        for down in after.get(todo.pop(), ()):
            if down not in out:
                out.add(down)
                todo.append(down)
    roots = {t: why for t, why in bad.items() if not any(u in out for u in deps.get(t, ()))}
    return Blocked(roots, frozenset(out - set(roots)))


def refusal_text(problems: Mapping[str, str], needs: Mapping[str, Iterable[str]],
                 shown: int = 6) -> str:
    """The run's one error: a line per toolchain that is not ready, its fix, the tasks
    that need it, as `needs` orders them (`problems` and `needs` are keyed by toolchain)."""
    n = len(problems)
    what = "a toolchain that is" if n == 1 else f"{n} toolchains that are"
    lines = [f"this run needs {what} not ready; no task that needs {'it' if n == 1 else 'them'} "
             f"starts, nor what only those tasks need:"]
    for name in sorted(problems):
        tasks = list(needs.get(name, ()))
        names = ", ".join(tasks[:shown]) + (f", … ({len(tasks) - shown} more)"
                                            if len(tasks) > shown else "")
        lines.append(f"  {problems[name]} (needed by {names})")
    return "\n".join(lines)
