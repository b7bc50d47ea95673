"""A real local Ray cluster for the tests: `python raycluster.py '<json list of node args>'`.

The first entry is the head node, each further one a node (`ray.cluster_utils.Cluster`
arguments: num_cpus, num_gpus, resources, node_name). Prints one JSON line with the
address once every node is up, then runs until SIGTERM, when it shuts every node down.
The test starts it inside a network namespace of its own, where only loopback exists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def start(nodes: list[dict], log: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """This file as a process (in the caller's network namespace); its address once up."""
    with open(log, "w") as err:  # the child keeps its own copy
        proc = subprocess.Popen([sys.executable, str(HERE), json.dumps(nodes)],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        stop(proc)
        raise RuntimeError(f"the Ray cluster did not start:\n{log.read_text()[-3000:]}")
    return proc, json.loads(line)["address"]


def stop(proc: subprocess.Popen) -> None:
    """By its PID: SIGTERM shuts every node down; SIGKILL if that takes over a minute."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    from ray.cluster_utils import Cluster

    nodes = json.loads(sys.argv[1])
    cluster = Cluster(initialize_head=True, head_node_args=nodes[0])
    for node in nodes[1:]:
        cluster.add_node(**node)
    cluster.wait_for_nodes()

    def stop(*_: object) -> None:
        cluster.shutdown()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"address": cluster.address}), flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
