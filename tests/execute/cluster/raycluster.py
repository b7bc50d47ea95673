"""A real local Ray cluster for the tests: `python raycluster.py '<json list of node args>'
['<json node types>']`.

The first entry is the head node, each further one a node (`ray.cluster_utils.Cluster`
arguments: num_cpus, num_gpus, resources, node_name, env_vars). Prints one JSON line with
the address once every node is up, then runs until SIGTERM, when it shuts every node down
and kills, by PID, whatever it had started that is still alive. The test starts it inside
a network namespace of its own, where only loopback exists.

With node types (autoscaler `available_node_types`: resources, min_workers, max_workers),
the head also runs Ray's autoscaler with the fake multi-node provider, which starts real
local nodes for pending tasks. Like every autoscaler of Ray 2.60, it does not publish its
node types where a driver could read them: the project declares them ([executor]
node_types).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from contextlib import suppress
from pathlib import Path

HERE = Path(__file__).resolve()


def start(nodes: list[dict], log: Path, env: dict[str, str],
          node_types: dict | None = None,
          command: tuple[str, ...] = (sys.executable, str(HERE))) -> tuple[subprocess.Popen, str]:
    """This file as a process (in the caller's network namespace), its address once up.
    `command` runs it (another user's: setpriv, which keeps the PID, their Python, a copy)."""
    args = [json.dumps(nodes)] + ([json.dumps(node_types)] if node_types else [])
    with open(log, "w") as err:  # the child keeps its own copy
        proc = subprocess.Popen([*command, *args],
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _autoscaling(head: dict, node_types: dict) -> dict:
    """The head's arguments for an autoscaler with the fake multi-node provider; the GCS
    port is fixed beforehand because the provider's nodes must be told where it is."""
    port = _free_port()
    config = {
        "cluster_name": "hefbuild-test", "max_workers": 8, "upscaling_speed": 1.0,
        "idle_timeout_minutes": 60, "head_node_type": "ray.head.default",
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "gcs_address": f"127.0.0.1:{port}"},
        "available_node_types": {**node_types, "ray.head.default": {
            "resources": {"CPU": head.get("num_cpus", 1)}, "node_config": {},
            "max_workers": 0}},
        "auth": {"ssh_user": "nobody"}, "docker": {}, "file_mounts": {},
        "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [],
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    os.environ.update({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"})
    return {**head, "gcs_server_port": port, "autoscaling_config": f.name}


def main() -> None:
    import psutil
    from ray.cluster_utils import Cluster

    nodes = json.loads(sys.argv[1])
    node_types = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
    head = _autoscaling(nodes[0], node_types) if node_types else nodes[0]
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for node in nodes[1:]:
        cluster.add_node(**node)
    cluster.wait_for_nodes()

    def stop(*_: object) -> None:
        # The autoscaler's nodes are its children, not the cluster's: kill them by PID.
        started = psutil.Process().children(recursive=True)
        cluster.shutdown()
        for proc in started:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        if node_types:
            os.unlink(head["autoscaling_config"])
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"address": cluster.address}), flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
