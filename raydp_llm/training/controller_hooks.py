"""What the driver hands Ray Train's controller to run there: ``ControllerHandle``.

The controller is a fresh Python process each run, and it imports the module of every callback it
is given before it starts the workers: this one imports Ray Train's callback interface alone
(fit.py, which imports the workers' loop and torch, cost the controller 1.75 s of CPU on the way
to every run's first step, on 2 cores).
"""

from __future__ import annotations

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.util.placement_group import placement_group_table, remove_placement_group

# the named actor of a sweep that keeps its trials' placement groups (cli/sweep/launcher.py): a
# trial a scheduler stops ends with its controller, whose group Ray Train's cleaner frees only
# through the State API, which a Ray without its dashboard does not serve
SWEEP_GROUPS = "raydp_llm_sweep_groups"


class ControllerHandle(ControllerCallback, WorkerGroupCallback):
    """Ray Train's controller posts its own handle to the run's hand-off once it runs, for the
    driver to abort the run (``fit.StartedFit.abort``), and each worker group's placement group
    once it started, for the driver to free it should the controller die (``StartedFit.close``).
    The handle goes boxed (``[ObjectRef]``): unpickled, it would import the controller's classes
    into the hand-off's process (2 s of CPU while the workers start)."""

    def __init__(self, handoff, sweep_key: str | None = None):
        self.handoff = handoff
        self.sweep_key = sweep_key  # a sweep's trial: its groups go to the sweep's ledger too

    def after_controller_start(self, train_run_context) -> None:
        self.handoff.set_controller.remote([ray.put(ray.get_runtime_context().current_actor)])

    def after_worker_group_start(self, worker_group) -> None:
        state = worker_group.get_worker_group_state()
        group = state.placement_group_handle.placement_group
        self.handoff.set_group.remote(group)
        if self.sweep_key is not None:  # the sweep frees it when the trial ends (cli/sweep/)
            ray.get_actor(SWEEP_GROUPS).add.remote(self.sweep_key, group)


def free_group(group) -> None:
    """A worker group's placement group, removed if its controller left it (killed, out of memory,
    its trial stopped)."""
    if placement_group_table(group)["state"] != "REMOVED":
        remove_placement_group(group)
