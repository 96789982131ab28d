"""The workers' torch process group, set up as Ray Train's ``TorchConfig`` sets it up, from a module
that imports no torch.

Ray Train sends the trainer's backend config to its controller, a fresh Python process each run,
which runs the backend's ``on_start`` and ``on_shutdown``. ``TorchConfig``'s module imports torch
there: about 1.5 s of CPU on the way to every run's first step (2 cores), for a process that only
tells the workers what to run. Here the controller imports Ray alone; the functions it sends the
workers import Ray Train's torch helpers where they run, in the workers, which import torch anyway.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray
from ray._private import ray_constants
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import (
    DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
    TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
)

log = logging.getLogger(__name__)


@dataclass
class ProcessGroupConfig(BackendConfig):
    """``TorchConfig`` with ``init_method="env"``: ``backend`` is "gloo" (CPUs) or "nccl" (GPUs)."""

    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type:
        return ProcessGroup

    @property
    def train_func_context(self) -> type:
        return CudaDevice

    @property
    def framework(self) -> None:
        # Not TrainingFramework.TORCH: with it, Ray Train's state tracking asks rank 0 for
        # torch.__version__, a TorchVersion whose unpickling imports torch in the controller, on the
        # way to the first step. The dashboard's Train view then shows no framework version.
        return None

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class CudaDevice:
    """Around the training function on a worker: its GPU, if it has one, is torch's current
    device (``TorchConfig``'s ``train_func_context``)."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self.inner = TorchConfigContextManager()
        return self.inner.__enter__()

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)


class ProcessGroup(Backend):
    """Ray Train's ``_TorchBackend`` for one node type, gloo or nccl: rank 0's address and a
    free port as the rendezvous, every worker joins; at the end every worker leaves."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group, backend_config: ProcessGroupConfig) -> None:
        address, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_environment, address=address, port=port)
        size = len(worker_group)
        ray.get([worker_group.execute_single_async(rank, _join, backend=backend_config.backend,
                                                   world_rank=rank, world_size=size,
                                                   timeout_s=backend_config.timeout_s)
                 for rank in range(size)])

    def on_shutdown(self, worker_group, backend_config: ProcessGroupConfig) -> None:
        leaving = worker_group.execute_async(_leave, destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(leaving, timeout=timeout_s)
        except GetTimeoutError:
            log.warning("the workers did not leave the process group within %ss", timeout_s)


def _set_environment(address: str, port: int) -> None:
    """On a worker: the rendezvous, and torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE...)."""
    from ray.train.torch.config import _set_torch_distributed_env_vars

    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)
    _set_torch_distributed_env_vars()


def _join(**group) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(init_method="env://", **group)


def _leave(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group)
