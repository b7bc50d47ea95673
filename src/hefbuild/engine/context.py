"""What every step of the rebuilder shares for one invocation: the project, the store and
its lock, the stat cache, toolchain identities, the fast path, the manifests read, the
event log, and the one place messages go (the terminal's progress lines, and warnings kept
for the caller)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .manifests import ManifestReader

if TYPE_CHECKING:
    from ..declare.checks import Checks
    from ..declare.project import Project, ProjectPaths
    from ..execute.toolchain import ToolchainResolver
    from ..store.events import EventLog
    from ..store.statcache import StatCache
    from ..store.store import Store
    from ..store.storelock import StoreLock
    from .fastpath import FastPath


@dataclass
class Context:
    project: Project
    paths: ProjectPaths
    stats: StatCache
    store: Store
    store_lock: StoreLock
    toolchains: ToolchainResolver
    fast: FastPath
    events: EventLog
    checks: Checks
    progress: Callable[[str], None] | None = None
    stream_logs: bool = False  # `doit -v 2`: each rule's output to the terminal as it runs
    warnings: list[str] = field(default_factory=list)
    # task -> (toolchain, seconds) its toolchain's environment took to get ready
    # (engine/envs.py): not the stage's time, so its event, manifest and task line leave it out.
    env_waits: dict[str, tuple[str, float]] = field(default_factory=dict)
    manifests: ManifestReader = field(default_factory=ManifestReader)

    def env_wait(self, task: str) -> float:
        return self.env_waits.get(task, ("", 0.0))[1]

    def say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        self.say(f"[hefbuild] WARNING: {message}")
