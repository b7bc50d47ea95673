"""The `[executor]` table of `hefbuild.toml`: where stages run (here, or on a Ray cluster),
overridden by HEFBUILD_EXECUTOR and HEFBUILD_RAY_ADDRESS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .layout import SETTINGS_FILE


@dataclass(frozen=True)
class ExecutorSettings:
    kind: str = "local"  # "local" or "ray"
    address: str | None = None  # the Ray cluster; None: ray's own default ("auto")
    # What each node type an autoscaler may start offers, where it does not say so itself
    # (a KubeRay worker group scaled to 0): a stage only such a node can run waits for it.
    node_types: tuple[dict[str, float], ...] = ()


EXECUTOR_KINDS = ("local", "ray")


def executor_settings(table: Any, env: dict[str, str]) -> ExecutorSettings:
    """The file's [executor]; HEFBUILD_RAY_ADDRESS alone turns the cluster on."""
    if not isinstance(table, dict):
        raise SpecError(SETTINGS_FILE, "executor", f"a table, got {type(table).__name__}")
    unknown = set(table) - {"kind", "address", "node_types"}
    if unknown:
        raise SpecError(SETTINGS_FILE, f"executor.{sorted(unknown)[0]}",
                        "unknown key (expected: kind, address, node_types)")
    kind = env.get("HEFBUILD_EXECUTOR") or table.get("kind", "local")
    address = env.get("HEFBUILD_RAY_ADDRESS") or table.get("address")
    if kind not in EXECUTOR_KINDS:
        raise SpecError(SETTINGS_FILE, "executor.kind (or HEFBUILD_EXECUTOR)",
                        f"one of {', '.join(EXECUTOR_KINDS)}, got {kind!r}")
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise SpecError(SETTINGS_FILE, "executor.address (or HEFBUILD_RAY_ADDRESS)",
                        f"a Ray address like \"host:6379\" or \"auto\", got {address!r}")
    if env.get("HEFBUILD_RAY_ADDRESS") and "HEFBUILD_EXECUTOR" not in env:
        kind = "ray"
    if kind == "ray":
        _refuse_ray_client(address, env)
    return ExecutorSettings(kind, address.strip() if address else None,
                            _node_types(table.get("node_types", [])))


def _node_types(value: Any) -> tuple[dict[str, float], ...]:
    from .resources import parse_resources  # only a project that declares node types

    if not isinstance(value, list):
        raise SpecError(SETTINGS_FILE, "executor.node_types", "a list of tables of resources "
                        "like [{CPU = 4, npu = 1}]")
    return tuple(parse_resources(t, SETTINGS_FILE, f"executor.node_types[{i}]")
                 for i, t in enumerate(value))


def _refuse_ray_client(address: str | None, env: dict[str, str]) -> None:
    """Ray Client (`ray://`) cannot run the streaming task a remote stage is (its log and
    heartbeats come back as they are made), so it is refused here, before any stage runs.
    Unset or "auto", ray.init reads RAY_ADDRESS: that is checked too."""
    where = "executor.address (or HEFBUILD_RAY_ADDRESS)"
    if address is None or address.strip() == "auto":
        address, where = env.get("RAY_ADDRESS"), "RAY_ADDRESS (executor.address unset or auto)"
    if address and address.strip().startswith("ray://"):
        raise SpecError(SETTINGS_FILE, where,
                        f"a GCS address like \"head:6379\" or \"auto\", got {address.strip()!r}: "
                        f"Ray Client (ray://) cannot stream a stage; run doit inside the "
                        f"cluster (on the head, or as a Ray Job: ray job submit -- doit ...)")
