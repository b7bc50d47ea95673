"""Running a rule in its toolchain: the host sandbox (bubblewrap, seccomp), docker,
venv toolchains, a Ray cluster; the watchdog and heartbeats; toolchain identity. The only
layer that starts processes. Imports remote/ (a cluster moves files through the CAS) and
the layers before it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..plan.limits import Limits
    from .base import ExecRequest, ExecResult, Executor, StageRun, Watch
    from .host import HostExecutor

__all__ = ["ExecRequest", "ExecResult", "Executor", "HostExecutor", "Limits", "StageRun", "Watch"]

# Imported when first named: a no-op imports `execute.toolchain` (the toolchains' stamps)
# and `execute.reach`, and neither the executors nor their sandbox and watchdog.
_HOME = {"ExecRequest": ".base", "ExecResult": ".base", "Executor": ".base",
         "StageRun": ".base", "Watch": ".base", "HostExecutor": ".host",
         "Limits": "..plan.limits"}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
