"""Which executor runs a toolchain kind: the host executor (host, venv and device stages:
a device stage's rule runs here and reaches its device itself), docker, or, with
`[executor] kind = "ray"`, the cluster in front of them. Each is made on first use; an
executor given by a test serves every kind."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .context import Context

if TYPE_CHECKING:
    from ..execute import Executor
    from ..execute.ray import RayCluster

HOST_KINDS = ("host", "ssh", "local", "venv")


class ExecutorChoice:
    def __init__(self, ctx: Context, given: Executor | None = None) -> None:
        self.ctx = ctx
        self._made: dict[str, Executor] = {}
        self._cluster: RayCluster | None = None
        if given is not None:
            self._made = dict.fromkeys((*HOST_KINDS, "docker"), given)

    def for_kind(self, kind: str) -> Executor:
        local = self._local(kind)
        settings = self.ctx.project.settings
        if settings.executor.kind != "ray":
            return local
        if f"ray-{kind}" not in self._made:
            from ..execute.ray import RayCluster, RayExecutor  # ray only when configured

            if self._cluster is None:
                self._cluster = RayCluster(settings.executor.address,
                                           settings.executor.node_types)
            self._made[f"ray-{kind}"] = RayExecutor(self._cluster, kind, local, settings,
                                                    self.ctx.store, self.ctx.warn)
        return self._made[f"ray-{kind}"]

    def _local(self, kind: str) -> Executor:
        if kind in HOST_KINDS and kind not in self._made:
            from ..execute import HostExecutor

            host = self._made.get("host") or HostExecutor()
            self._made.update(dict.fromkeys(HOST_KINDS, host))
        if kind not in self._made:
            from ..execute.docker import DockerExecutor  # the docker SDK only when needed

            self._made[kind] = DockerExecutor()
        return self._made[kind]
