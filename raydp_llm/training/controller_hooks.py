"""What the driver hands Ray Train's controller to run there: ``ControllerHandle``.

The controller is a fresh Python process each run, and it imports the module of every callback it
is given before it starts the workers: this one imports Ray Train's callback interface alone
(fit.py, which imports the workers' loop and torch, cost the controller 1.75 s of CPU on the way
to every run's first step, on 2 cores).
"""

from __future__ import annotations

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback


class ControllerHandle(ControllerCallback, WorkerGroupCallback):
    """Ray Train's controller posts its own handle to the run's hand-off once it runs, for the
    driver to abort the run (``fit.StartedFit.abort``), and each worker group's placement group
    once it started, for the driver to free it should the controller die (``StartedFit.close``).
    The handle goes boxed (``[ObjectRef]``): unpickled, it would import the controller's classes
    into the hand-off's process (2 s of CPU while the workers start)."""

    def __init__(self, handoff):
        self.handoff = handoff

    def after_controller_start(self, train_run_context) -> None:
        self.handoff.set_controller.remote([ray.put(ray.get_runtime_context().current_actor)])

    def after_worker_group_start(self, worker_group) -> None:
        state = worker_group.get_worker_group_state()
        self.handoff.set_group.remote(state.placement_group_handle.placement_group)
