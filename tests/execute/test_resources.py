"""Stage resources: parsed with one-line errors, layered, mapped to Ray's task options, and
checked against what the cluster's nodes offer before anything is submitted."""

from __future__ import annotations

import pytest

from hefbuild.declare.resources import merged, parse_resources, shown
from hefbuild.declare.settings import CacheSettings, Settings, load_settings
from hefbuild.errors import SpecError, StageError
from hefbuild.execute.base import StageRun
from hefbuild.execute.ray import RayExecutor, lacking, ray_options, unplaceable, wanted
from hefbuild.report.summary import nodes_of, summary_line


def test_amounts_and_memory_sizes_parse() -> None:
    got = parse_resources({"GPU": 1, "memory": "2GiB", "gpu_host": 0.5}, "m.toml", "k")
    assert got == {"GPU": 1.0, "memory": float(2 << 30), "gpu_host": 0.5}
    assert shown(got) == "GPU=1, gpu_host=0.5, memory=2.0 GiB"


@pytest.mark.parametrize(("value", "key", "expected"), [
    ([1], "stages.x.resources", "a table of resources"),
    ({"GPU": 0}, "stages.x.resources.GPU", "a positive number, got 0"),
    ({"GPU": True}, "stages.x.resources.GPU", "a positive number, got True"),
    ({"memory": "lots"}, "stages.x.resources.memory", "a memory size"),
    ({"bad name": 1}, "stages.x.resources.bad name", "a resource name"),
])
def test_a_bad_table_is_a_one_line_error(value: object, key: str, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_resources(value, "models/m.toml", "stages.x.resources")
    text = str(err.value)
    assert text.startswith(f"models/m.toml: {key}: ") and expected in text
    assert "\n" not in text


def test_later_layers_win_name_by_name() -> None:
    toolchain, target, model = {"hailo10h": 1.0}, {"CPU": 2.0}, {"CPU": 4.0}
    assert merged(toolchain, target, model) == {"hailo10h": 1.0, "CPU": 4.0}


def test_ray_options_map_builtins_and_custom_resources() -> None:
    options = ray_options({"CPU": 2.0, "memory": 1024.0, "hailo10h": 1.0}, gpu=False)
    assert options == {"num_cpus": 2.0, "memory": 1024, "resources": {"hailo10h": 1.0}}
    assert ray_options({}, gpu=True) == {"num_cpus": 1, "num_gpus": 1}
    assert ray_options({"GPU": 2.0}, gpu=True)["num_gpus"] == 2.0
    assert wanted(ray_options({"hailo10h": 1.0}, gpu=True)) == \
        {"CPU": 1.0, "GPU": 1.0, "hailo10h": 1.0}


NODES = [{"Resources": {"CPU": 2.0, "node:127.0.0.1": 1.0}},
         {"Resources": {"CPU": 1.0, "GPU": 1.0, "gpu_host": 1.0}},
         {"Resources": {"CPU": 1.0, "hailo10h": 1.0}}]


def test_a_stage_some_node_can_run_is_placeable() -> None:
    assert unplaceable({"CPU": 1.0, "GPU": 1.0}, NODES) is None
    assert unplaceable({"CPU": 2.0}, NODES) is None


def test_the_missing_resource_is_named() -> None:
    why = unplaceable({"CPU": 1.0, "tpu": 2.0}, NODES)
    assert why is not None and why.startswith("no node offers tpu=2 (the 3 nodes offer: ")
    assert "node:" not in why
    assert unplaceable({"GPU": 1.0, "hailo10h": 1.0}, NODES) == \
        "no single node offers GPU=1, hailo10h=1 together"


def test_the_executor_setting_and_its_environment(tmp_path) -> None:  # noqa: ANN001
    assert load_settings(tmp_path, {}).executor.kind == "local"
    on = load_settings(tmp_path, {"HEFBUILD_RAY_ADDRESS": "127.0.0.1:6379"}).executor
    assert (on.kind, on.address) == ("ray", "127.0.0.1:6379")
    off = load_settings(tmp_path, {"HEFBUILD_RAY_ADDRESS": "x:1", "HEFBUILD_EXECUTOR": "local"})
    assert off.executor.kind == "local"
    (tmp_path / "hefbuild.toml").write_text('[executor]\nkind = "slurm"\n')
    with pytest.raises(SpecError, match=r"^hefbuild.toml: executor.kind .*got 'slurm'$"):
        load_settings(tmp_path, {})
    (tmp_path / "hefbuild.toml").write_text('[executor]\nkind = "ray"\nnodes = 3\n')
    with pytest.raises(SpecError, match=r"^hefbuild.toml: executor.nodes: unknown key"):
        load_settings(tmp_path, {})


def test_the_end_of_run_line_names_the_node_of_each_built_stage() -> None:
    events = [{"task": "b:m", "outcome": "built", "node": "gpu-1"},
              {"task": "a:m", "outcome": "built", "node": "cpu-1"},
              {"task": "c:m", "outcome": "built", "node": "gpu-1"},
              {"task": "d:m", "outcome": "restored"}]
    nodes = nodes_of(events)
    assert nodes == {"cpu-1": ["a:m"], "gpu-1": ["b:m", "c:m"]}
    line = summary_line({"built": 3, "nodes": nodes})
    assert line.endswith("; ran on cpu-1 (a:m), gpu-1 (b:m, c:m)")
    assert "ran on" not in summary_line({"built": 3})


def test_a_stages_declared_code_is_part_of_its_rule(tmp_path) -> None:  # noqa: ANN001
    """A script the rule ships but does not import (hailo10h verify's device_check.py) is
    among its code files: in its key, and sent with it to a cluster node."""
    from hefbuild.plan.actions import rule_code_files

    rules = tmp_path / "rules"
    (rules / "common").mkdir(parents=True)
    (rules / "common/__init__.py").write_text("")
    (rules / "common/util.py").write_text("X = 1\n")
    (rules / "t").mkdir()
    (rules / "t/run.py").write_text("print('rule')\n")
    (rules / "t/ship.py").write_text("from common import util\n")
    assert rule_code_files(rules, "t/run.py") == [rules / "t/run.py"]
    assert rule_code_files(rules, "t/run.py", ("t/ship.py",)) == sorted(
        [rules / "t/run.py", rules / "t/ship.py", rules / "common/util.py",
         rules / "common/__init__.py"])


# -- an autoscaler's declared node types; the loopback warning ----------------------------

class FakeCluster:
    """What the executor asks of a cluster: its live nodes and declared node types."""

    address = "head:6379"
    driver_address = "10.0.0.5"

    def __init__(self, live: list[dict], declared: list[dict[str, float]]) -> None:
        self.live, self.types, self.warned = live, declared, set()

    def nodes(self) -> list[dict]:
        return self.live

    def declared(self) -> list[dict[str, float]]:
        return self.types


def executor(cluster: FakeCluster, warned: list[str] | None = None) -> RayExecutor:
    settings = Settings(cache=CacheSettings(remote="http://127.0.0.1:8080/cache"))
    return RayExecutor(cluster, "host", None, settings, None,  # type: ignore[arg-type]
                       warned.append if warned is not None else None)


STAGE = StageRun(task="verify:m", interpreter="python3", rules_dir=None, rule="r.py",  # type: ignore[arg-type]
                 action={}, inputs={}, files={}, scratch=None, env={})  # type: ignore[arg-type]
DEVICE_TYPE = {"CPU": 4.0, "hailo10h": 1.0}
LIVE = NODES[:2]  # the device host is not up (an autoscaler starts it)


def test_a_resource_only_a_declared_node_type_offers_is_waited_for() -> None:
    ray_executor = executor(FakeCluster(LIVE, [DEVICE_TYPE]))
    need = {"CPU": 1.0, "hailo10h": 1.0}
    assert ray_executor._placeable(STAGE, need) == {"hailo10h": 1.0}
    assert shown(lacking(need, LIVE)) == "hailo10h=1"


def test_a_live_node_that_offers_it_needs_no_wait() -> None:
    assert executor(FakeCluster(LIVE, [DEVICE_TYPE]))._placeable(STAGE, {"GPU": 1.0}) is None


def test_without_declared_types_or_with_none_that_fits_it_is_refused_at_once() -> None:
    with pytest.raises(StageError, match=r"no node offers hailo10h=1 \(the 2 nodes offer"):
        executor(FakeCluster(LIVE, []))._placeable(STAGE, {"hailo10h": 1.0})
    with pytest.raises(StageError) as err:
        executor(FakeCluster(LIVE, [DEVICE_TYPE]))._placeable(STAGE, {"tpu": 2.0})
    assert str(err.value).endswith("no node offers tpu=2 (the 2 nodes offer: CPU, GPU, "
                                   "gpu_host); nor does any node type the autoscaler "
                                   "may start (they offer: CPU, hailo10h) in the Ray cluster "
                                   "at head:6379")


def test_a_node_off_this_host_with_a_loopback_cache_is_warned_about_once_per_run() -> None:
    warned: list[str] = []
    ray_executor = executor(FakeCluster(LIVE, []), warned)
    for _ in range(2):
        ray_executor._on_node({"name": "gpu-1", "address": "10.0.0.7"})
    ray_executor._on_node({"name": "cpu-1", "address": "10.0.0.5"})  # this host
    assert warned == ["the remote cache http://127.0.0.1:8080/cache is on loopback, and node "
                      "gpu-1 (10.0.0.7) is not on this host (10.0.0.5): there 127.0.0.1 is "
                      "the node itself; set [cache] remote to an address every node reaches"]
