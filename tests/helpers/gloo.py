"""Plain torch processes joined in a gloo process group (no Ray), running the project's own
``Worker`` and ``TrainLoop``: ``spawned(world, job)`` returns rank 0's result, ``run`` a loop's
curve with each report's checkpoint kept as Ray Train would upload it."""

from __future__ import annotations

import datetime
import os
import shutil
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.training.objectives import Placement
from raydp_llm.training.worker.loop import TrainLoop
from raydp_llm.training.worker.worker import Worker


def placement(rank: int, world: int) -> Placement:
    return Placement(rank, world, rank, torch.device("cpu"))


def _process(rank: int, world: int, port: int, job, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # a collective one rank never joins fails in minutes, not gloo's default half hour
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        result = job(rank, world)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def spawned(world: int, job, tmp_path: Path):
    """``job(rank, world)`` in ``world`` gloo processes; rank 0's result."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / f"result-{port}.pt"
    mp.spawn(_process, args=(world, port, job, out), nprocs=world)
    return torch.load(out, weights_only=True)  # tensors, lists, numbers: nothing unpickled


class Checkpoints:
    """The loop's reports; each rank's checkpoint directory merged into ``keep/step_N``, as Ray
    Train uploads every worker's into one."""

    def __init__(self, keep: Path):
        self.rows, self.keep = [], keep

    def __call__(self, metrics: dict, checkpoint: Path | None = None) -> None:
        self.rows.append(metrics)
        if checkpoint is not None:
            shutil.copytree(checkpoint, self.keep / f"step_{metrics['step']}", dirs_exist_ok=True)


def curve(rows: list[dict]) -> list[tuple]:
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in rows]


def run(spec, data, rank, world, keep: Path, resume: Path | None = None) -> list[tuple]:
    """The loop from step 0, or from ``resume``; its curve."""
    worker = Worker(spec, data, placement(rank, world))
    state = worker.load_checkpoint(resume) if resume else TrainState()
    reports = Checkpoints(keep)
    TrainLoop(worker, state, reports).run()
    return curve(reports.rows)
