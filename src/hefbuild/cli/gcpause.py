"""The cyclic garbage collector while doit loads the tasks.

Loading makes what the whole invocation keeps: the declarations, the plan, a task dict and
a doit Task per stage (1000 models: over a million objects). Each full collection in
between walks all of them again and frees nothing (what they hold lives until the process
ends); at 5000 tasks that was a fifth of a no-op. So collection pauses while they are made;
then what was made is frozen (`gc.freeze`: left out of every later collection, as it lives
as long as the process) and collection goes on as before for what the run makes. What is
frozen is not collected at exit either (a fast exit), so what must be closed at the end
of a run is closed explicitly (the engine's SQLite stat cache: cli/session.py).
"""

from __future__ import annotations

import gc

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
