"""The Ray executor, as ratios against a baseline run side by side.

    python benchmarks/ray_cluster.py [--models N] [--stages S] [--rounds R]

Runs inside a network namespace of its own (re-executes itself under `unshare --net`,
root needed): every socket on loopback, as our machines require. The Ray nodes are
`ray.cluster_utils.Cluster` nodes on this one host, each with ONE CPU slot; the remote
cache is a private nginx on 127.0.0.1 (tests/fakes/cache_server.py).

(a) wall time of `doit -n N` building N tiny models (tiny-llama with N different seeds:
    export, quantize, compile, verify on the cluster; fetch, the source stage, is built
    beforehand, locally, and is not timed) on 1 node vs 2 nodes (ratio). Both nodes share
    this machine's cores: the ratio shows how the executor fills two nodes' slots, not
    what two separate machines would give.
(b) per-stage overhead: S trivial stages (write one small file), one at a time, with the
    local executor vs the Ray executor on a warm cluster (median task seconds from
    build/events.jsonl; difference in ms).
Rounds alternate the order of the runs; medians are reported. Prints a table; asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]
from execute.cluster.raycluster import start, stop  # noqa: E402
from fakes.cache_server import NginxCache  # noqa: E402

PARTS = ("dodo.py", "pyproject.toml", "models", "toolchain", "rules", "data", "targets", "images")
TRIVIAL_TARGET = '''[target]
description = "one trivial stage"
[[stages]]
name = "touch"
rule = "touch.py"
inputs = []
outputs = ["x.txt"]
[stages.params.n]
type = "int"
default = 0
'''
TRIVIAL_RULE = '''import json, sys
from pathlib import Path
a = json.loads(Path(sys.argv[1]).read_text())
(Path(a["out"]) / "x.txt").write_text(str(a["params"]["n"]))
'''


def start_cluster(nodes: int, tmp: Path) -> tuple[subprocess.Popen, str]:
    spec = [{"num_cpus": 1, "node_name": f"node-{i}"} for i in range(nodes)]
    env = {**os.environ, "HEFBUILD_STORE": str(tmp / f"node-store-{nodes}"),
           "RAY_BACKEND_LOG_LEVEL": "error", "RAY_USAGE_STATS_ENABLED": "0"}
    tmp.mkdir(parents=True, exist_ok=True)
    return start(spec, tmp / f"cluster-{nodes}.err", env)


def doit(root: Path, store: Path, *args: str, env: dict[str, str]) -> float:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HEFBUILD_")}
    full.update({"HEFBUILD_STORE": str(store), **env})
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, env=full,
                          capture_output=True, text=True)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")
    return seconds


def tiny_project(root: Path, models: int) -> list[str]:
    root.mkdir(parents=True)
    for part in PARTS:
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / part)
    for f in (root / "models").glob("*.toml"):
        f.unlink()
    base = (REPO / "models/tiny-llama.toml").read_text()
    names = [f"tiny-{i}" for i in range(models)]
    for i, name in enumerate(names):
        (root / f"models/{name}.toml").write_text(base.replace("seed = 1234", f"seed = {i}"))
    return names


def bench_models(tmp: Path, models: int, rounds: int, cache: NginxCache) -> dict[int, list]:
    walls: dict[int, list[float]] = {1: [], 2: []}
    for r in range(rounds):
        for nodes in ((1, 2) if r % 2 == 0 else (2, 1)):
            proc, address = start_cluster(nodes, tmp / f"r{r}")
            try:
                root, store = tmp / f"r{r}/models-{nodes}", tmp / f"r{r}/store-{nodes}"
                names = tiny_project(root, models)
                local = {"HEFBUILD_EXECUTOR": "local"}
                doit(root, store, "-n", "2", *[f"fetch:{n}" for n in names], env=local)
                remote = {"HEFBUILD_RAY_ADDRESS": address, "HEFBUILD_REMOTE_CACHE": cache.url}
                walls[nodes].append(doit(root, store, "-n", str(models),
                                         *[f"verify:{n}" for n in names], env=remote))
            finally:
                stop(proc)
    return walls


def task_seconds(root: Path) -> list[float]:
    lines = (root / "build/events.jsonl").read_text().splitlines()
    return [e["seconds"] for e in map(json.loads, lines) if e.get("outcome") == "built"]


def bench_overhead(tmp: Path, stages: int, rounds: int, cache: NginxCache) -> dict[str, list]:
    proc, address = start_cluster(1, tmp / "overhead")
    seconds: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        for r in range(rounds):
            for kind in (("local", "ray") if r % 2 == 0 else ("ray", "local")):
                root = tmp / f"overhead/{kind}-{r}"
                for rel, text in {"targets/t.toml": TRIVIAL_TARGET, "rules/touch.py":
                                  TRIVIAL_RULE, "toolchain/host.toml":
                                  '[toolchain]\nkind = "host"\n'}.items():
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / rel).write_text(text)
                for i in range(stages):
                    (root / f"models/m{i}.toml").parent.mkdir(exist_ok=True)
                    (root / f"models/m{i}.toml").write_text(
                        f'[model]\ntarget = "t"\n[stages.touch]\nn = {i + 1000 * r}\n')
                shutil.copy2(REPO / "dodo.py", root / "dodo.py")
                env = ({"HEFBUILD_EXECUTOR": "local"} if kind == "local" else
                       {"HEFBUILD_RAY_ADDRESS": address, "HEFBUILD_REMOTE_CACHE": cache.url})
                doit(root, tmp / f"overhead/store-{kind}-{r}", "touch", env=env)
                seconds[kind] += task_seconds(root)
    finally:
        stop(proc)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--stages", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if os.environ.get("HEFBUILD_BENCH_NETNS") != "1":
        os.execvp("unshare", ["unshare", "--net", "sh", "-c",
                              "ip link set lo up && HEFBUILD_BENCH_NETNS=1 exec "
                              f"{sys.executable} {' '.join(sys.argv)}"])
    tmp = Path(tempfile.mkdtemp(prefix="hefbuild-cluster-bench-"))
    cache = NginxCache(root=tmp / "nginx").start()
    try:
        over = bench_overhead(tmp, args.stages, args.rounds, cache)
        walls = bench_models(tmp, args.models, args.rounds, cache)
    finally:
        cache.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    loc, ray = statistics.median(over["local"]), statistics.median(over["ray"])
    print(f"cores on this host: {os.cpu_count()}; Ray nodes share them, one CPU slot each")
    print(f"(a) {args.models} tiny models, doit -n {args.models}, export..verify on the cluster")
    print(f"    1 node : {med[1]:7.1f} s   runs {[round(x, 1) for x in walls[1]]}")
    print(f"    2 nodes: {med[2]:7.1f} s   runs {[round(x, 1) for x in walls[2]]}")
    print(f"    ratio 1 node / 2 nodes: {med[1] / med[2]:.2f}x")
    print(f"(b) per-stage time of a trivial stage, median of {len(over['local'])} stages")
    print(f"    local executor: {loc * 1000:7.0f} ms")
    print(f"    Ray executor  : {ray * 1000:7.0f} ms   overhead {1000 * (ray - loc):+.0f} ms "
          f"({ray / loc:.1f}x)")


if __name__ == "__main__":
    main()
