"""A stage task's `uptodate` check: the fast path's last verdict, else the engine.

doit probes every uptodate item of every task it makes (`configure_task`? callable? a
tuple?) and inspects each callable's signature when it asks it (for its magic `task` and
`values` arguments). A `(function, args)` tuple fails two of those probes, each an
exception; `UptodateCheck` answers them at once, and its signature is set once.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from .session import engine_for, fast_path_at, table_at


def check_uptodate(root: str, task: str) -> bool:
    """The last verdict while nothing it read changed; else the engine decides. For `doit
    list --status` and `doit info` (nothing runs first) an upstream that would run makes
    its downstream not up to date either, as `doit status` and `doit explain` say."""
    try:
        if not _own_uptodate(root, task):
            return False
        if not _inspecting(sys.argv[1:]):
            return True  # in a run, doit asks only after the upstream tasks are done
        return all(check_uptodate(root, up) for up in table_at(root).upstream_of(task))
    except KeyboardInterrupt:
        print(f"hefbuild: interrupted (Ctrl-C) while checking {task}", file=sys.stderr)
        raise SystemExit(130) from None


def _own_uptodate(root: str, task: str) -> bool:
    if fast_path_at(root).answer(task, table_at(root).toolchain_of(task)) is not None:
        return True
    return engine_for(root).is_uptodate(task)


def _inspecting(argv: list[str]) -> bool:
    words = [w for w in argv if not w.startswith("-")]
    return bool(words) and words[0] in ("list", "info")


class UptodateCheck:
    """`check_uptodate(root, task)` as doit's uptodate item (module-level and with plain
    fields, so that it pickles for `doit -P process`)."""

    __slots__ = ("root", "task")
    __signature__ = inspect.Signature()  # no magic arguments: doit passes none

    def __init__(self, root: str, task: str) -> None:
        self.root, self.task = root, task

    def __call__(self) -> bool:
        return check_uptodate(self.root, self.task)

    def configure_task(self, task: Any) -> None:
        """doit's hook for an uptodate object; a stage check needs nothing of its Task."""

    def __repr__(self) -> str:  # what `doit info` shows of a check that said no
        return f"check_uptodate({self.root!r}, {self.task!r})"

    def __getstate__(self) -> tuple[str, str]:
        return self.root, self.task

    def __setstate__(self, state: tuple[str, str]) -> None:
        self.root, self.task = state
