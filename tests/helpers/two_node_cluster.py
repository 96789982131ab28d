"""A Ray cluster of two nodes on this machine, for tests/integration/test_multinode.py: ``python
tests/helpers/two_node_cluster.py CPUS``.

It starts a head node and a worker node (``ray.cluster_utils.Cluster``: two raylets, each with
``CPUS`` logical CPUs, its own object store and its own node id; no dashboard), then prints one JSON
line, ``{"address": <GCS address>, "nodes": [<head node id>, <worker node id>]}``, and answers
commands on stdin:

- ``actors``: one JSON line, every actor the cluster has had (dead ones too), from the GCS actor
  table: ``[{"id": ..., "class": ..., "name": ..., "node": <node id>, "state": ...}, ...]``
- ``replace``: the worker node removed without grace (its raylet, object store and workers killed,
  as when an instance is lost), then a fresh node of the same size added, as EMR replaces a core
  node; one JSON line, ``{"removed": <node id>, "added": <node id>}``
- ``stop``, or the end of stdin (the test process is gone): shut both nodes down and exit.

It runs in its own process because a process can be connected to one Ray only (pytest's may hold the
session's embedded Ray). Ray's sockets and session files go under ``$RAY_TMPDIR``; the Java workers
that host Spark's executors need JAVA_HOME before the raylets start, so the JDK is found first.
"""

from __future__ import annotations

import json
import sys

from raydp_llm.engines.java import ensure_java

NODE = dict(include_dashboard=False, object_store_memory=256 * 1024 * 1024)


def main(cpus: int) -> None:
    ensure_java()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": cpus})
    try:
        worker = cluster.add_node(**NODE, num_cpus=cpus)
        cluster.wait_for_nodes()
        print(
            json.dumps(
                {"address": cluster.address, "nodes": [cluster.head_node.node_id, worker.node_id]}
            ),
            flush=True,
        )
        for line in sys.stdin:
            if line.strip() == "actors":
                table = cluster.global_state.actor_table(None)
                print(
                    json.dumps(
                        [
                            {
                                "id": actor_id,
                                "class": a["ActorClassName"],
                                "name": a["Name"],
                                "node": a["Address"]["NodeID"],
                                "state": a["State"],
                            }
                            for actor_id, a in table.items()
                        ]
                    ),
                    flush=True,
                )
            elif line.strip() == "replace":
                cluster.remove_node(worker, allow_graceful=False)
                removed, worker = worker.node_id, cluster.add_node(**NODE, num_cpus=cpus)
                cluster.wait_for_nodes()
                print(json.dumps({"removed": removed, "added": worker.node_id}), flush=True)
            elif line.strip() == "stop":
                break
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]))
