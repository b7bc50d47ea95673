"""Where a stage runs and under which limits: resolved from the model, the toolchain and the
environment. None of this enters a key (see key.py): it decides whether and where a stage
runs, never what it makes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..declare.resources import merged
from ..declare.toolchains import ToolchainSpec
from ..errors import SpecError
from .actions import Action


@dataclass(frozen=True)
class Limits:
    """Resource limits of one stage. Not part of any key: they decide whether a stage
    finishes, never what it produces."""

    timeout_s: float | None = None
    memory_bytes: int | None = None
    cpus: float | None = None
    gpu: bool = False
    # What the node that runs it must offer (declare/resources.py); only a cluster looks.
    resources: dict[str, float] = field(default_factory=dict)


DEFAULT_TIMEOUT_S = 48 * 3600.0  # a 30-layer compile takes 4.5 h; this catches true hangs


def stage_limits(action: Action, tc: ToolchainSpec) -> Limits:
    """The model's limits for this stage, else the toolchain's, else the defaults."""
    declared = tc.limits
    timeout = action.limits.timeout_s or declared.get("timeout") or DEFAULT_TIMEOUT_S
    memory = action.limits.memory_bytes or declared.get("memory") or default_memory_cap()
    return Limits(timeout_s=timeout, memory_bytes=memory, cpus=declared.get("cpus"),
                  gpu=action.limits.gpu,
                  resources=merged(tc.resources, action.limits.resources))


def default_memory_cap() -> int:
    """90 % of physical memory: a runaway compiler pass fails instead of taking the host."""
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return int(pages * size * 0.9)


def device_target(tc: ToolchainSpec) -> dict[str, Any]:
    """Where the device stage reaches its device: the toolchain's, unless
    HEFBUILD_DEVICE (`ssh://user@host:port` or `local`) says otherwise, e.g. on a CI runner."""
    device = {k: v for k, v in tc.device.items()}
    device["interpreter"] = tc.interpreter  # the device host's python (runs device_check.py)
    override = os.environ.get("HEFBUILD_DEVICE", "").strip()
    if override == "local":
        device["kind"] = "local"
    elif override:
        parsed = urlsplit(override)
        if parsed.scheme != "ssh" or not parsed.hostname:
            raise SpecError("HEFBUILD_DEVICE", "", f"ssh://user@host:port or local, "
                            f"got {override!r}")
        device.update(kind="ssh", host=parsed.hostname, port=parsed.port or 22)
        if parsed.username:
            device["user"] = parsed.username
        pinned = os.environ.get("HEFBUILD_DEVICE_HOST_KEY", "").strip()
        if pinned:  # that host's own key(s), one a line (checked by rules/common/device.py)
            device.update(host_key=pinned.splitlines(), host_key_for=None,
                          host_key_from="HEFBUILD_DEVICE_HOST_KEY")
    if device.get("key_file"):
        device["key_file"] = os.path.expanduser(device["key_file"])
    return device
