"""Stages on a real Ray cluster (three nodes, loopback only): each on a node that offers
what it declares, inputs and outputs through the remote cache, results like a local build."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from e2e.conftest import REPO, Project, copy_project

import hefbuild

from .conftest import NODE_VERSION, PINNED, site_with

pytestmark = pytest.mark.e2e

# A target whose stages ask for what the cluster's nodes offer: `train` a GPU host (and a
# GPU, through gpu = true), `check` the device host (its toolchain's default), `prep`
# nothing beyond a CPU; `slow` sleeps, to be killed.
TARGET = '''
[target]
description = "stages that need different nodes"
check = "check"

[[stages]]
name = "prep"
rule = "cl/write.py"
inputs = []
outputs = ["data.txt"]
[stages.params.word]
type = "str"
default = "seed"
[stages.params.sleep]
type = "float"
default = 0.0

[[stages]]
name = "train"
rule = "cl/write.py"
inputs = ["prep"]
outputs = ["weights.txt", "extra/notes.txt"]
gpu = true
resources = { gpu_host = 1 }
[stages.params.word]
type = "str"
default = "trained"
[stages.params.sleep]
type = "float"
default = 0.0

[[stages]]
name = "check"
rule = "cl/write.py"
inputs = ["train"]
outputs = ["report.json"]
toolchain = "device"
[stages.params.word]
type = "str"
default = "checked"
[stages.params.sleep]
type = "float"
default = 0.0
'''

WRITE = '''"""Write what the upstream stages wrote plus our word; sleep first if asked."""
import json, sys, time
from pathlib import Path
action = json.loads(Path(sys.argv[1]).read_text())
print("starting", action["stage"], flush=True)
time.sleep(action["params"]["sleep"])
if action["params"]["word"] == "fail":
    sys.exit("error: the word was fail")
seen = [p.read_text() for d in sorted(action["inputs"].values())
        for p in sorted(Path(d).rglob("*")) if p.is_file()]
text = "".join(seen) + action["params"]["word"] + "\\n"
out = Path(action["out"])
for rel in action["outputs"]:
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"passed": True, "text": text}) if rel.endswith(".json") else text
    (out / rel).write_text(body)
print("done", action["stage"], flush=True)
'''

MODEL = '''[model]
target = "cl"
[stages.prep]
word = "{word}"
'''


def cluster_project(root: Path, store: Path, cluster: dict, models: dict[str, str]) -> Project:
    files = {"targets/cl.toml": TARGET, "rules/cl/write.py": WRITE,
             "toolchain/host.toml": '[toolchain]\nkind = "host"\n',
             "toolchain/device.toml": '[toolchain]\nkind = "host"\n\n[resources]\nhailo10h = 1\n',
             "hefbuild.toml": f'[cache]\nremote = "{cluster["cache"].url}"\n\n'
                              f'[executor]\nkind = "ray"\naddress = "{cluster["address"]}"\n'}
    files.update({f"models/{name}.toml": text for name, text in models.items()})
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    shutil.copy2(REPO / "dodo.py", root / "dodo.py")
    return Project(root, store)


def ran_on(project: Project, model: str, stage: str) -> str | None:
    manifest = json.loads((project.root / f"build/{model}/{stage}/manifest.json").read_text())
    return (manifest.get("ran_on") or {}).get("name")


def test_every_socket_of_the_cluster_is_on_loopback(cluster: dict) -> None:
    listening = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout
    addresses = [line.split()[3] for line in listening.splitlines()]
    assert len(addresses) >= 5, listening  # gcs, raylets, object managers, nginx
    loopback = ("127.", "[::ffff:127.", "[::1]", "*:")  # `*` here: the namespace has only lo
    assert all(a.startswith(loopback) for a in addresses), listening
    interfaces = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert [line.split(":")[1].strip() for line in interfaces.splitlines()] == ["lo"]


def test_each_stage_runs_on_a_node_with_its_resources(cluster: dict, tmp_path: Path) -> None:
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster,
                              {"m1": MODEL.format(word="one")})
    run = project.doit("check:m1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.outcomes() == {"prep:m1": "built", "train:m1": "built", "check:m1": "built"}
    assert ran_on(project, "m1", "train") == "gpu-node"
    assert ran_on(project, "m1", "check") == "device-node"
    assert ran_on(project, "m1", "prep") in {"cpu-node", "device-node", "gpu-node"}
    report = json.loads((project.root / "build/m1/check/report.json").read_text())
    assert report["text"] == "one\ntrained\n" * 2 + "checked\n"  # both train outputs came back
    assert "train:m1" in run.stdout and "on gpu-node" in run.stdout
    summary = next(line for line in run.stdout.splitlines() if line.startswith("hefbuild: "))
    assert "ran on " in summary and "device-node (check:m1)" in summary
    # the node's log reached build/ on the driver, and nothing came through a local run
    assert "running on node gpu-node" in (project.root / "build/m1/train/log.txt").read_text()
    # Every node is on this host (loopback only): a loopback cache is right, no warning.
    assert "is on loopback" not in run.stdout + run.stderr

    # Only descriptions travelled through Ray: every blob went through the cache, each
    # put at most once (the driver and the nodes ask first), and no entry was published.
    puts = [path for method, path, _ in cluster["cache"].requests() if method == "PUT"]
    assert puts and len(puts) == len(set(puts)), puts
    assert all("/cas/" in p for p in puts), puts

    again = project.doit("check:m1")
    assert again.returncode == 0 and again.tasks("built") == set(), again.stdout


def test_a_stage_no_node_can_run_fails_at_once_naming_the_resource(
        cluster: dict, tmp_path: Path) -> None:
    model = MODEL.format(word="tpu") + "[stages.train]\nresources = { tpu = 2 }\n"
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster, {"m2": model})
    run = project.doit("train:m2")
    assert run.returncode != 0
    assert "train:m2 needs" in run.stdout + run.stderr
    assert "no node offers tpu=2" in run.stdout + run.stderr
    assert not (project.root / "build/m2/train/manifest.json").exists()
    assert (project.root / "build/m2/prep/manifest.json").exists()  # its upstream ran


def _stage_worker() -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline"]):
        if any("run_remote_stage" in part for part in proc.info["cmdline"] or []):
            return proc
    return None


def _train_running(project: Project, model: str) -> tuple[subprocess.Popen, psutil.Process]:
    """`doit train:<model>` started, once the rule prints on its node; and its Ray worker."""
    proc = project.popen(f"train:{model}")
    running = project.root / f"build/{model}/train.running.log"
    deadline = time.monotonic() + 120
    while "starting train" not in (running.read_text() if running.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    worker = _stage_worker()
    assert worker is not None
    return proc, worker


def test_a_worker_killed_mid_stage_leaves_no_result_and_a_rerun_succeeds(
        cluster: dict, tmp_path: Path) -> None:
    model = MODEL.format(word="kill") + "[stages.train]\nsleep = 4.0\n"
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster, {"m3": model})
    proc, worker = _train_running(project, "m3")
    os.kill(worker.pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "train:m3: the Ray task on node gpu-node ended without a result" in out + err
    assert not (project.root / "build/m3/train/manifest.json").exists()
    assert not any(cluster["node_store"].rglob("*.running*"))

    rerun = project.doit("train:m3")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert rerun.outcomes()["train:m3"] == "built"
    assert ran_on(project, "m3", "train") == "gpu-node"


def test_parallel_stages_spread_over_the_cluster(cluster: dict, tmp_path: Path) -> None:
    models = {f"p{i}": MODEL.format(word=f"w{i}") + "sleep = 2.0\n"  # in [stages.prep]
              for i in range(3)}
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster, models)
    run = project.doit("-n", "3", *[f"prep:p{i}" for i in range(3)])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.tasks("built") == {"prep:p0", "prep:p1", "prep:p2"}
    nodes = {ran_on(project, f"p{i}", "prep") for i in range(3)}
    assert len(nodes) >= 2, nodes  # 4 CPUs over three nodes: not all on one


# About a minute: the whole tiny chain on the cluster, compared with the local build of it
# that the session makes once (built_store, shared with the e2e tests).
def test_the_tiny_pipeline_on_the_cluster_is_byte_identical_to_a_local_build(
        cluster: dict, tmp_path: Path, built_store: tuple) -> None:
    local = copy_project(tmp_path / "local", built_store[0])
    remote = copy_project(tmp_path / "remote", tmp_path / "remote-store")
    (remote.root / "hefbuild.toml").write_text(
        f'[cache]\nremote = "{cluster["cache"].url}"\n\n'
        f'[executor]\nkind = "ray"\naddress = "{cluster["address"]}"\n')
    built = remote.doit("verify:tiny-llama")
    assert built.returncode == 0, built.stdout + built.stderr
    reference = local.doit("verify:tiny-llama", env={"HEFBUILD_EXECUTOR": "local"})
    assert reference.returncode == 0, reference.stdout + reference.stderr
    for stage in ("fetch", "export", "quantize", "compile", "verify"):
        ours = json.loads((remote.root / f"build/tiny-llama/{stage}/manifest.json").read_text())
        theirs = json.loads((local.root / f"build/tiny-llama/{stage}/manifest.json").read_text())
        assert ours["key"] == theirs["key"], stage
        if stage in ("quantize", "compile"):  # deterministic stages: the same bytes
            assert ours["outputs"] == theirs["outputs"], stage
        assert ("ran_on" in ours) == (stage != "fetch"), stage  # the source stage stays here
        assert "ran_on" not in theirs


def test_heartbeats_of_a_remote_stage_reach_the_driver(cluster: dict, tmp_path: Path) -> None:
    model = MODEL.format(word="beat") + "[stages.train]\nsleep = 3.5\n"
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster, {"m5": model})
    run = project.doit("train:m5", env={"HEFBUILD_HEARTBEAT_S": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    lines = (project.root / "build/events.jsonl").read_text().splitlines()
    beats = [json.loads(x) for x in lines if '"heartbeat"' in x and "train:m5" in x]
    running = [b for b in beats if "waiting_for" not in b["heartbeat"]]  # not before it starts
    assert running and all(b["heartbeat"].get("node") == "gpu-node" for b in running), lines
    assert "[hefbuild] train:m5: " in run.stdout + run.stderr  # shown on the terminal too


def test_ctrl_c_on_the_driver_cancels_the_remote_stage(cluster: dict, tmp_path: Path) -> None:
    model = MODEL.format(word="cancel") + "[stages.train]\nsleep = 60.0\n"
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster, {"m6": model})
    proc, worker = _train_running(project, "m6")
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    psutil.wait_procs([worker], timeout=30)
    assert not worker.is_running(), "the Ray task still runs after Ctrl-C on the driver"
    assert not (project.root / "build/m6/train/manifest.json").exists()


def test_a_rule_that_fails_on_a_node_fails_here_with_its_own_line(
        cluster: dict, tmp_path: Path) -> None:
    model = MODEL.format(word="x") + "[stages.train]\nword = \"fail\"\n"
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster, {"m7": model})
    run = project.doit("train:m7")
    assert run.returncode != 0
    assert run.outcomes()["train:m7"] == "failed"
    assert "error: the word was fail" in run.stdout + run.stderr
    failed_log = (project.root / "build/m7/train.failed.log").read_text()
    assert "running on node gpu-node" in failed_log and "the word was fail" in failed_log
    assert not (project.root / "build/m7/train/manifest.json").exists()


def test_a_node_with_another_toolchain_refuses_the_stage_and_stores_nothing(
        cluster: dict, tmp_path: Path) -> None:
    # The driver has npu-runtime 1.0 (the key says so); the device node's interpreter
    # reports 2.0 (conftest): the node must refuse rather than store under this key.
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster,
                              {"m8": MODEL.format(word="pin") + 'toolchain = "pinned"\n'})
    (project.root / "toolchain/pinned.toml").write_text(
        f'[toolchain]\nkind = "host"\n\n[packages]\n"{PINNED}" = "1.0"\n\n'
        f'[resources]\nhailo10h = 1\n')
    site = site_with(tmp_path / "driver-site", PINNED, "1.0")
    before = _objects(cluster["node_store"])
    run = project.doit("prep:m8", env={"PYTHONPATH": str(site)})
    out = run.stdout + run.stderr
    assert run.returncode != 0 and run.outcomes() == {"prep:m8": "failed"}, out
    assert (f"prep:m8: node device-node has {PINNED} {NODE_VERSION}, the key was made for 1.0 "
            f"(toolchain pinned): nothing stored") in out
    assert "Traceback" not in out
    assert not (project.root / "build/m8/prep/manifest.json").exists()
    assert _objects(cluster["node_store"]) == before  # the node fetched nothing either


def test_a_node_that_runs_another_hefbuild_refuses_naming_itself(
        cluster: dict, tmp_path: Path) -> None:
    # The driver runs an edited copy of hefbuild (same version string, other source).
    edited = tmp_path / "edited" / "hefbuild"
    shutil.copytree(Path(hefbuild.__file__).parent, edited,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(edited / "__init__.py", "a") as init:
        init.write("# an edited checkout\n")
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster,
                              {"m9": MODEL.format(word="version")})
    run = project.doit("prep:m9", env={"PYTHONPATH": str(edited.parent)})
    out = run.stdout + run.stderr
    assert run.returncode != 0 and run.outcomes() == {"prep:m9": "failed"}, out
    found = re.search(r"prep:m9: node (\S+) runs hefbuild (\S+) \(source sha256:\w{12}…\), "
                      r"the driver (\S+) \(source sha256:\w{12}…\): install the driver's "
                      r"hefbuild on that node: nothing stored", out)
    assert found is not None, out
    assert found.group(1) in {"cpu-node", "device-node", "gpu-node"}
    assert found.group(2) == found.group(3) == hefbuild.__version__
    assert not (project.root / "build/m9/prep/manifest.json").exists()


def test_a_node_store_over_its_gc_limit_is_brought_under_it(
        cluster: dict, tmp_path: Path) -> None:
    objects = cluster["node_store"] / "v1" / "objects"
    junk = os.urandom(2 << 20)
    digest = hashlib.sha256(junk).hexdigest()
    stale = objects / digest[:2] / digest[2:]
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(junk)  # what earlier stages left: the node store is over 1 MiB now
    project = cluster_project(tmp_path / "p", tmp_path / "store", cluster,
                              {"g1": MODEL.format(word="bounded")})
    with open(project.root / "hefbuild.toml", "a") as settings:
        settings.write('\n[gc]\nmax_size = "1M"\n')
    run = project.doit("prep:g1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert not stale.exists()
    assert sum(size for size in _objects(cluster["node_store"]).values()) <= 1 << 20
    assert (project.root / "build/g1/prep/data.txt").read_text() == "bounded\n"


def _objects(store: Path) -> dict[str, int]:
    """The node store's objects and their sizes."""
    return {p.name: p.stat().st_size for p in (store / "v1" / "objects").glob("*/*")}
