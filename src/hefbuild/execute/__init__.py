"""Running a rule in its toolchain: the host sandbox (bubblewrap, seccomp), docker,
venv toolchains, a Ray cluster; the watchdog and heartbeats; toolchain identity. The only
layer that starts processes. Imports remote/ (a cluster moves files through the CAS) and
the layers before it.
"""

from ..plan.limits import Limits
from .base import ExecRequest, ExecResult, Executor, StageRun, Watch
from .host import HostExecutor

__all__ = ["ExecRequest", "ExecResult", "Executor", "HostExecutor", "Limits", "StageRun", "Watch"]
