"""A run's own actors (its hand-off, the sweep's Spark turns and ledger) live on the node of the
process that makes them, as Ray Train's controller lives on the driver's: an actor placed on
another node dies with that node and takes what it holds with it, and everything waiting on it
waits on a dead actor (issue 61: a lost worker node ended an EMR run, every restarted worker
group waiting on the hand-off that had been placed there)."""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def on_this_node() -> NodeAffinitySchedulingStrategy:
    """The scheduling strategy that places an actor on this process's node, never elsewhere."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
