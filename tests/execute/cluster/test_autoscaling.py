"""A cluster with an autoscaler: a stage that only a declared node type can run waits for
the autoscaler to start such a node, and says so; one no node type offers is refused at
once. The cluster is a head with one CPU and Ray's autoscaler with the fake multi-node
provider (real local nodes, started for pending tasks), in the loopback-only namespace.

This module's cluster is up only while its own tests run (module scope; pytest runs this
file before the package's three-node cluster is first asked for)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.cache_server import NginxCache

from .conftest import inside, ray_sessions
from .raycluster import start, stop
from .test_cluster import MODEL, cluster_project

pytestmark = pytest.mark.e2e

HEAD = [{"num_cpus": 1, "node_name": "head"}]
NODE_TYPES = {"device": {"resources": {"CPU": 1, "hailo10h": 1}, "node_config": {},
                         "min_workers": 0, "max_workers": 1}}


@pytest.fixture(scope="module")
def autoscaling(netns: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("autoscaling")
    env = {**os.environ, "HEFBUILD_STORE": str(tmp / "node-store"),
           "RAY_BACKEND_LOG_LEVEL": "error", "RAY_USAGE_STATS_ENABLED": "0"}
    with ray_sessions() as sessions, inside(netns):
        env["RAY_TMPDIR"] = str(sessions)
        proc, address = start(HEAD, tmp / "cluster.err", env, NODE_TYPES)
        cache = NginxCache(root=tmp / "nginx").start()
        try:
            yield {"address": address, "cache": cache}
        finally:
            cache.stop()
            stop(proc)


def declare_node_types(project) -> None:  # noqa: ANN001
    """What the autoscaler may start, as the project says (Ray's autoscaler does not)."""
    settings = project.root / "hefbuild.toml"
    settings.write_text(settings.read_text() + "node_types = [{ CPU = 1, hailo10h = 1 }]\n")


def test_a_stage_only_a_declared_node_type_offers_waits_for_it(
        autoscaling: dict, tmp_path: Path) -> None:
    model = MODEL.format(word="scaled") + "resources = { hailo10h = 1 }\n"  # [stages.prep]
    project = cluster_project(tmp_path / "p", tmp_path / "store", autoscaling, {"a1": model})
    declare_node_types(project)
    run = project.doit("prep:a1")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "[hefbuild] prep:a1: waiting for a node with hailo10h=1" in out
    manifest = json.loads((project.root / "build/a1/prep/manifest.json").read_text())
    # The fake provider names the nodes it starts fff…00001, fff…00002, …
    assert manifest["ran_on"]["id"].endswith("00001"), manifest["ran_on"]
    beats = [json.loads(x) for x in (project.root / "build/events.jsonl").read_text()
             .splitlines() if '"heartbeat"' in x]
    assert any(b["heartbeat"].get("waiting_for") == {"hailo10h": 1.0} for b in beats), beats


def test_a_stage_no_declared_node_type_offers_is_still_refused_at_once(
        autoscaling: dict, tmp_path: Path) -> None:
    model = MODEL.format(word="tpu") + "resources = { tpu = 2 }\n"
    project = cluster_project(tmp_path / "p", tmp_path / "store", autoscaling, {"a2": model})
    declare_node_types(project)
    run = project.doit("prep:a2")
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert "prep:a2 needs CPU=1, tpu=2: no node offers tpu=2" in out
    assert "nor does any node type the autoscaler may start (they offer: CPU, hailo10h)" in out
    assert "waiting for a node" not in out
