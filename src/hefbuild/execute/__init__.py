"""Executors run one rule inside its toolchain; only they start processes."""

from .base import ExecRequest, ExecResult, Executor, Limits, StageRun, Watch
from .host import HostExecutor

__all__ = ["ExecRequest", "ExecResult", "Executor", "HostExecutor", "Limits", "StageRun", "Watch"]
