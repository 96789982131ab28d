"""The training loop of one worker (``TrainLoop``, plain torch), and Ray Train's entry to it on
every worker (``train_loop``).

Data order is fixed by the seed, whatever the number of workers (data/stream.py): the batch of
optimizer step ``s`` of an epoch is window ``s`` of each of ``batch_size`` lanes of the epoch's
seeded window sequence, and each worker reads only its own lanes' chunks. A checkpoint stores the
step and the epoch, so a resumed run, with the same or another number of workers, seeks to its step
(reading nothing before it) and continues as if never stopped.

Every ``eval_interval`` steps all ranks report metrics (``ray.train.report`` is a barrier); every
``checkpoint_interval`` steps and at the end rank 0 attaches a training checkpoint (see
checkpoint.py), or, when checkpoints are sharded (fsdp, LoRA), every rank attaches its part
(sharded.py) into one directory of the run's storage, the seal landing last (``upload_checkpoint``).

Faults: Ray Train restarts a worker group that lost a worker (``max_failures``), from the last
checkpoint. A non-finite gradient norm, loss or weight ends the run at once: every rank sees it at
the same step (the gradients are all-reduced, the losses summed over the ranks), reports it, and
returns; nothing non-finite is ever checkpointed.
"""

from __future__ import annotations

import functools
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import ray
import ray.train
import ray.train.collective
import ray.train.torch
from ray.train import Checkpoint

from raydp_llm.checkpoint.layout import TrainState, is_sharded
from raydp_llm.core import integrity
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import resolve, write_file, write_tree
from raydp_llm.core.timing import Stopwatch
from raydp_llm.training.handoff import LivePosts, delivered, post_group
from raydp_llm.training.objectives import Interval, Placement
from raydp_llm.training.worker.optim import lr_at
from raydp_llm.training.worker.parallel import grad_stats, non_finite_weights
from raydp_llm.training.worker.worker import Worker

# Where the loop's reports go: report(metrics) on every rank, report(metrics, checkpoint directory)
# on the ranks that write checkpoints when one is due. Ray Train's in a run (``ray_report``), a
# list in a test.
Report = Callable[..., None]


class TrainLoop:
    """nanoGPT's loop on one worker: epoch after epoch, an optimizer step per group of
    micro-batches; every ``eval_interval`` steps an evaluation and a report (with a checkpoint
    every ``checkpoint_interval``). A divergence ends the run on every rank at the same step.
    ``state`` is where the run stands, updated step by step."""

    def __init__(self, worker: Worker, state: TrainState, report: Report,
                 live: LivePosts | None = None):
        self.worker, self.spec, self.state = worker, worker.spec, state
        self.report, self.live = report, live  # live: rank 0's posts to the driver
        self.run_clock, self.interval = Stopwatch(already_s=state.elapsed_s), Interval()

    def run(self) -> bool:
        """Train to ``max_steps``; False when the run diverged (reported, not checkpointed)."""
        state, spec = self.state, self.spec
        self.worker.start(state)  # dpo.reference=precomputed: its table, once
        while state.step < spec.max_steps:
            for group in self.worker.data.steps(state.epoch, state.step_in_epoch):
                if not self.step(group):
                    return False
                if state.step >= spec.max_steps:
                    break
            else:  # the epoch is over
                state.epoch, state.step_in_epoch = state.epoch + 1, 0
        return True

    def step(self, group: list) -> bool:
        """One optimizer step, and the evaluation when one is due; False when it diverged."""
        worker, state, live = self.worker, self.state, self.live
        step_clock, lr = Stopwatch(), lr_at(state.step, self.spec)
        try:
            result = worker.train_step(group, lr, state.step)
        except InputError as err:  # it cannot go on (grpo: a reward failing on every batch)
            # every rank: the failures were all-reduced; restarting would only fail again
            self.report({"step": state.step + 1, "diverged": str(err), "stopped": True})
            return False
        if live and live.first_step:
            live.mark("first_step")
        state.step, state.step_in_epoch = state.step + 1, state.step_in_epoch + 1
        if not math.isfinite(result.grad_norm):  # every rank: the gradients were all-reduced
            self.report({"step": state.step, "diverged": f"loss {result.loss:.4g}, gradient norm "
                                                         f"{result.grad_norm:.4g}"})
            return False
        evaluate_now = (state.step % self.spec.train.eval_interval == 0
                        or state.step == self.spec.max_steps)
        grads = grad_stats(worker.model) if evaluate_now else {}
        worker.optimizer.zero_grad(set_to_none=True)
        self.interval.add(result, step_clock.seconds())
        if live:
            live.step(state.step, result.loss, self.interval.tokens_per_s(worker.tokens_per_step),
                      result.live)
        if not evaluate_now:
            return True
        state.elapsed_s = self.run_clock.seconds()
        if not self.reported(worker.metrics(self.interval, state, lr) | grads):
            return False
        self.interval = Interval()
        return True

    def reported(self, metrics: dict) -> bool:
        """An evaluation's report, with a checkpoint when one is due; False (and the divergence
        reported instead) when something in it is not finite."""
        bad = divergence(metrics, self.worker.model)
        if bad:
            self.report({"step": metrics["step"], "diverged": bad})
            return False
        if self.live:
            self.live.evaluation({k: metrics[k] for k in ("val_loss", "val_reward")
                                  if metrics.get(k) is not None})
        step, spec = metrics["step"], self.spec
        interval = spec.train.checkpoint_every
        keep = step == spec.max_steps or bool(interval and step % interval == 0)
        if not keep or not self.worker.writes_checkpoints:
            self.report(metrics)
            return True
        with tempfile.TemporaryDirectory() as tmp:  # rank 0 (every rank: sharded) attaches it
            self.worker.save_checkpoint(Path(tmp), self.state)
            metrics |= self.worker.task_columns(Path(tmp), step)  # train.eval_tasks, when due
            self.report(metrics, Path(tmp))
        return True


def divergence(metrics: dict, model) -> str | None:
    """What is not finite at an evaluation (the training or validation loss, the weights), or None.
    Every rank finds the same: the losses are summed over the ranks and the weights are equal."""
    bad = [
        f"{key} {metrics[key]:.4g}"
        for key in ("train_loss", "val_loss")
        if metrics[key] is not None and not math.isfinite(metrics[key])  # grpo: no val_loss
    ]
    tensors = non_finite_weights(model)
    if tensors:
        bad.append(f"{tensors} weight tensors with NaN or infinite values")
    return ", ".join(bad) or None


# ---------------------------------------------------------------- Ray Train's entry


def ray_placement() -> Placement:
    """This worker's place, as Ray Train's context tells it."""
    ctx = ray.train.get_context()
    return Placement(ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank(),
                     ray.train.torch.get_device())


def ray_report(metrics: dict, checkpoint: Path | None = None) -> None:
    """``ray.train.report`` (a barrier: every rank calls it), with the checkpoint directory rank 0
    (every rank, when sharded) attaches, uploaded by ``upload_checkpoint``."""
    if checkpoint is None:
        ray.train.report(metrics)
        return
    upload = functools.partial(upload_checkpoint, every_rank=is_sharded(checkpoint))
    ray.train.report(metrics, checkpoint=Checkpoint.from_directory(checkpoint),
                     checkpoint_upload_fn=upload)


def upload_checkpoint(checkpoint: Checkpoint, name: str, every_rank: bool) -> Checkpoint:
    """A checkpoint directory into the run's storage (local or S3) as Ray Train names it, its seal
    (``complete.json``) the last file to land: ``every_rank`` (a sharded checkpoint: each rank
    uploads its part) waits for every rank's files before rank 0 writes the seal. Ray Train's own
    upload copies each rank's part on its own, so rank 0's seal could land while another rank's
    shards were still being copied: a kill then left a sealed checkpoint with a short shard.

    Through ``storage.write_tree``, not Ray Train's copy (``pafs.copy_files``), which can lose a
    file whose upload failed and still register the checkpoint: here the report fails instead (Ray
    Train retries the upload, then restarts the workers from the last checkpoint)."""
    storage = ray.train.get_context().get_storage()
    fs, path = storage.storage_filesystem, storage.build_checkpoint_path_from_name(name)
    write_tree(checkpoint.path, fs, path, hold_seal=True)
    if every_rank:
        ray.train.collective.barrier()  # every rank's part has landed
    seal = Path(checkpoint.path) / integrity.MARKER
    if seal.exists():  # rank 0's
        write_file(seal, fs, f"{path}/{integrity.MARKER}")
    return Checkpoint(path, filesystem=fs)


def restore(worker: Worker, resume_from: str | None) -> TrainState:
    """The training state to start from: Ray's latest checkpoint when it restarts this run's
    workers, else the checkpoint the run resumes, else step 0."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and resume_from:
        filesystem, path = resolve(resume_from, worker.spec.s3)
        checkpoint = Checkpoint(path, filesystem=filesystem)
    if checkpoint is None:
        return TrainState()
    with checkpoint.as_directory() as d:
        return worker.load_checkpoint(Path(d))


def train_loop(config: dict) -> None:
    """One DDP worker, as Ray Train starts it: placed where its context says, the spec and the
    data taken from the run's hand-off (the driver delivers them once the ETL is done; nothing, and
    the worker returns, when it gave up), the model wrapped for DDP (``prepare_model``), the state
    restored, then the loop. Rank 0 marks its start-up phases on the driver's board
    (``FitResult.marks``)."""
    run = config["run"]
    loop_start = time.time()
    placement = ray_placement()
    live = LivePosts(run.handoff, run.run_name) if placement.rank == 0 else None
    if live:  # start-up, phase by phase (fit.STARTUP_SPANS)
        live.mark("loop_start", loop_start)
        post_group(run)
    delivery = delivered(run.handoff)
    if delivery is None:  # the driver's error (or Ctrl-C) ends the run
        return
    if live:
        live.mark("data")
    spec = delivery.spec
    worker = Worker(spec, delivery.data, placement, prepare=ray.train.torch.prepare_model)
    state = restore(worker, delivery.resume_from)
    if live:
        live.mark("worker_ready")
    finished = TrainLoop(worker, state, ray_report, live).run()
    if live and finished:
        live.mark("last_step", first=False)
