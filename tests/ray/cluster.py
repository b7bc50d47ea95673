"""A real local Ray cluster for the tests: `python cluster.py '<json list of node args>'`.

The first entry is the head node, each further one a node (`ray.cluster_utils.Cluster`
arguments: num_cpus, num_gpus, resources, node_name). Prints one JSON line with the
address once every node is up, then runs until SIGTERM, when it shuts every node down.
The test starts it inside a network namespace of its own, where only loopback exists.
"""

from __future__ import annotations

import json
import signal
import sys

from ray.cluster_utils import Cluster


def main() -> None:
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
