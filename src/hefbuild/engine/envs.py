"""A stage's toolchain environment, made ready before its rule runs: the interpreter of a
host or docker toolchain as declared, or a venv toolchain's environment, created on its
first use (minutes: pip installs the lock).

Creating an environment is not the stage's work, so it is accounted on its own: heartbeats
of its own while pip runs (`creating venv toolchain <name>, pip install: …` on the terminal,
`heartbeat` lines with an `env` field in the event log), one `env` line in
build/events.jsonl with its seconds (or its error), and its time is kept out of the stage's
`seconds` on the task line, in its event and in its manifest (`Context.env_waits`, which
the installer and the recorder subtract). Waiting for another process that creates the same
environment counts the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..declare.toolchains import ToolchainSpec
from ..errors import HefbuildError
from ..execute.toolchain import interpreter_path
from ..plan.actions import Action
from ..plan.key import ActionKey
from .context import Context
from .failures import one_line
from .stagerun import env_seconds

if TYPE_CHECKING:
    from ..execute import Watch
    from ..execute.venvs import Ready


class Environments:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @contextmanager
    def python(self, action: Action, tc: ToolchainSpec, key: ActionKey,
               running: Path) -> Iterator[str]:
        """The python that runs the stage's rule, its environment held in use meanwhile."""
        if tc.kind != "venv":
            yield interpreter_path(tc)
            return
        ctx, started = self.ctx, time.monotonic()
        with ExitStack() as stack:
            try:
                ready = stack.enter_context(ctx.toolchains.venv_env(
                    tc, ctx.store.root / "venvs", self._say(action, running),
                    self._watch(action, tc, key)))
            except HefbuildError as exc:
                ctx.events.env(action.task, key.hex, tc.name, time.monotonic() - started,
                               error=one_line(exc))
                raise
            self._account(action, tc, key, ready)
            yield str(ready.python)

    def _account(self, action: Action, tc: ToolchainSpec, key: ActionKey,
                 ready: Ready) -> None:
        if ready.seconds is None:
            return  # it was there: nothing to account
        self.ctx.env_waits[action.task] = (tc.name, ready.seconds)
        self.ctx.events.env(action.task, key.hex, tc.name, ready.seconds,
                            created=ready.created)

    def _say(self, action: Action, running: Path) -> Callable[[str], None]:
        """What the creation says goes to the terminal and into the stage's log."""
        def say(message: str) -> None:
            with open(running, "a") as log:
                log.write(f"[hefbuild] {message}\n")
            self.ctx.say(f"[hefbuild] {action.task}: {message}")

        return say

    def _watch(self, action: Action, tc: ToolchainSpec, key: ActionKey) -> Watch:
        from ..execute import Watch

        ctx = self.ctx

        def emit(beat: dict[str, Any]) -> None:
            ctx.events.heartbeat(action.task, key.hex, {**beat, "env": tc.name})
            ctx.say(f"[hefbuild] {action.task}: creating venv toolchain {tc.name}, "
                    f"{beat.get('step', 'pip install')}: {beat['message']}")

        return Watch(env_seconds("HEFBUILD_HEARTBEAT_S", 60.0),
                     env_seconds("HEFBUILD_SILENCE_S", 900.0), emit)
