"""The cyclic garbage collector while doit loads the tasks and while a run decides them.

Loading makes what the whole invocation keeps: the declarations, the plan, a task dict and
a doit Task per stage (1000 models: over a million objects). Each full collection in
between walks all of them again and frees nothing (what they hold lives until the process
ends); at 5000 tasks that was a fifth of a no-op. So collection pauses while they are made;
then what was made is frozen (`gc.freeze`: left out of every later collection, as it lives
as long as the process) and collection goes on as before for what the run makes. What is
frozen is not collected at exit either (a fast exit), so what must be closed at the end
of a run is closed explicitly (the engine's SQLite stat cache: cli/session.py).

A run (`doit run`: the reporter) pauses it again from its start until the first task
runs or the engine is first needed, or else the run ends: the preflight and doit's pass
over up-to-date tasks keep what they make (verdicts, stat signatures, answers) to the end
too, and their young-generation collections were a few percent of a 5000-task no-op. A
forked worker (`doit -n N`) collects again from its start.
"""

from __future__ import annotations

import gc
import os

_paused: list[bool] = []  # [True] while this module holds collection paused


def pause() -> None:
    """Pause collection, unless it is already off (the caller's choice, left as it is)."""
    if not _paused and gc.isenabled():
        gc.disable()
        _paused.append(True)


def resume() -> None:
    """Freeze what was made since `pause` and collect again from here on."""
    if _paused:
        _paused.clear()
        gc.freeze()
        gc.enable()


def _in_child() -> None:
    """A forked process (a `doit -n N` worker) runs stages: it collects from its start."""
    if _paused:
        _paused.clear()
        gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
