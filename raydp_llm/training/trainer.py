"""Training with Ray Train: a ``TorchTrainer`` runs ``train_loop`` on every DDP worker.

Data order is fixed by the seed, whatever the number of workers (data/stream.py): the batch of
optimizer step ``s`` of an epoch is window ``s`` of each of ``batch_size`` lanes of the epoch's
seeded window sequence, and each worker reads only its own lanes' chunks. A checkpoint stores the
step and the epoch, so a resumed run, with the same or another number of workers, seeks to its step
(reading nothing before it) and continues as if never stopped.

Every ``eval_interval`` steps all ranks report metrics (``ray.train.report`` is a barrier); every
``checkpoint_interval`` steps and at the end rank 0 attaches a training checkpoint (see
checkpoint.py).

Faults: Ray Train restarts a worker group that lost a worker (``max_failures``), from the last
checkpoint. A non-finite gradient norm, loss or weight ends the run at once: every rank sees it at
the same step (the gradients are all-reduced, the losses summed over the ranks), reports it, and
returns; nothing non-finite is ever checkpointed.
"""

from __future__ import annotations

import contextlib
import math
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raydp_llm.core import hf
from raydp_llm.core.model import build_model
from raydp_llm.core.storage import resolve
from raydp_llm.core.timing import Stopwatch
from raydp_llm.core.tokenizer import tokenizer_from_json
from raydp_llm.data.batches import WindowBatch
from raydp_llm.data.stream import ChunkReader, EpochOrder, Lanes, ordered_positions
from raydp_llm.training.checkpoint import load_train_checkpoint, save_train_checkpoint
from raydp_llm.training.metrics import MetricsWriter, RestartRecorder, read_divergence, read_events
from raydp_llm.training.progress import LivePosts, ProgressBoard, TrainingProgress
from raydp_llm.training.spec import TrainSpec


@dataclass(frozen=True)
class RunContext:
    """What a run adds beside the spec: its Ray Train name (which tags its Ray metrics), the
    driver's progress board (progress.py) that rank 0 posts to, and the checkpoint it starts from
    (local or s3://), if any."""

    run_name: str
    board: object = None
    resume_from: str | None = None


@dataclass(frozen=True)
class Launch:
    """Where the driver runs the workers and keeps what they make: checkpoints in ``storage`` (a
    directory or s3://), metrics in ``out_dir``, workers placed by ``placement`` (PACK when None).
    Their number, GPUs and how many losses a run survives are the spec's ``train`` settings."""

    out_dir: Path
    storage: str
    placement: str | None = None
    on_metrics: Callable[[dict], None] | None = None  # each new metrics.csv row, on the driver


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr`` at ``max_steps``."""
    if step < spec.optim.warmup_steps:
        return spec.optim.lr * (step + 1) / spec.optim.warmup_steps
    progress = min(
        1.0, (step - spec.optim.warmup_steps) / max(1, spec.max_steps - spec.optim.warmup_steps)
    )
    return spec.optim.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (
        spec.optim.lr - spec.optim.min_lr
    )


def make_optimizer(model: torch.nn.Module, spec: TrainSpec) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, LayerNorm gains); frozen parameters
    left out."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=spec.optim.lr, betas=(spec.optim.beta1, spec.optim.beta2))


class WorkerData:
    """One worker's windows: its lanes of each epoch's training sequence, and its share of the
    validation windows. ``data`` = ``{split: (source, ChunkIndex)}`` (data/stream.py)."""

    def __init__(self, spec: TrainSpec, data: dict, rank: int, world: int):
        self.spec, self.rank, self.world = spec, rank, world
        self.lanes = Lanes(spec.train.batch_size, rank, world)
        open_chunks = spec.train.batch_size // world + 2  # at most one per lane, and some slack
        self.readers = {name: ChunkReader(source, index, spec.token_dtype, open_chunks)
                        for name, (source, index) in data.items()}
        self.val_order = EpochOrder(data["val"][1], spec.sampling["val"], spec.seed, epoch=None)
        self.epoch_reads = {"epoch": None, "windows": 0, "chunks": 0}

    def steps(self, epoch: int, first_step: int):
        """This worker's micro-batches for the optimizer steps ``first_step..`` of ``epoch``,
        ``grad_accum`` at a time."""
        spec, reader = self.spec, self.readers["train"]
        order = EpochOrder(reader.index, spec.sampling["train"], spec.seed, epoch)
        before = reader.counts()
        for step in range(first_step, spec.steps_per_epoch):
            windows = reader.windows(order, self.lanes.positions(step, spec.steps_per_epoch))
            after = reader.counts()
            self.epoch_reads = {"epoch": epoch,
                                "windows": after["windows_read"] - before["windows_read"],
                                "chunks": after["chunks_read"] - before["chunks_read"]}
            yield np.split(windows, spec.train.grad_accum)

    def val_batches(self):
        """This worker's contiguous share of the first ``eval_batches × batch_size / grad_accum``
        validation windows (all when None: the same windows with any number of workers)."""
        spec = self.spec
        micro = spec.micro_batch(self.world)
        limit = None if spec.train.eval_batches is None else spec.train.eval_batches * micro * \
            self.world
        positions = ordered_positions(self.val_order.total, limit, self.rank, self.world)
        for lo in range(0, len(positions), micro):
            yield self.readers["val"].windows(self.val_order, positions[lo:lo + micro])


def _all_reduce_sum(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def _loss_and_hits(model, x: torch.Tensor, y: torch.Tensor, autocast) -> tuple[torch.Tensor, int]:
    with autocast():
        logits, loss = model(x, y)
    return loss, int((logits.argmax(dim=-1) == y).sum())


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: WorkerData, collate: WindowBatch,
             autocast) -> tuple[float, float]:
    """Validation loss (per token) and top-1 accuracy over this worker's share of the validation
    windows, summed over the workers."""
    model.eval()
    loss_sum = hits = count = 0
    for windows in data.val_batches():
        x, y = collate(windows)
        loss, h = _loss_and_hits(model, x, y, autocast)
        loss_sum, hits, count = loss_sum + loss.item() * y.numel(), hits + h, count + y.numel()
    model.train()
    loss_sum, hits, count = _all_reduce_sum(loss_sum, hits, count)
    return loss_sum / max(count, 1), hits / max(count, 1)


def _all_reduce_max(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


class Interval:
    """What happens between two reports: losses, hits, gradient norms, step times."""

    def __init__(self):
        self.loss = self.hits = self.count = self.grad_norm = self.step_s = 0.0
        self.steps, self.clock = 0, Stopwatch()

    def add(self, step: StepResult, step_s: float) -> None:
        self.loss += step.loss
        self.hits += step.hits
        self.count += step.count
        self.grad_norm += step.grad_norm
        self.step_s += step_s
        self.steps += 1

    def tokens_per_s(self, tokens_per_step: int) -> float:
        return self.steps * tokens_per_step / self.clock.seconds()


def grad_stats(model: torch.nn.Module) -> dict:
    """Mean, min, max and variance of the gradients' magnitudes (the DL4J projects' gradient
    statistics)."""
    g = torch.cat(
        [p.grad.detach().abs().flatten().float() for p in model.parameters() if p.grad is not None]
    )
    return {
        "grad_abs_mean": g.mean().item(),
        "grad_abs_min": g.min().item(),
        "grad_abs_max": g.max().item(),
        "grad_abs_var": g.var().item(),
    }


def system_stats(process: psutil.Process, device: torch.device) -> dict:
    """This worker's memory and CPU load, the node's, and GPU memory when on a GPU."""
    mem = psutil.virtual_memory()
    return {
        "rss_mb": process.memory_info().rss / 2**20,
        "sys_mem_used_mb": (mem.total - mem.available) / 2**20,
        "sys_mem_total_mb": mem.total / 2**20,
        "cpu_percent": process.cpu_percent(),
        "sys_cpu_percent": psutil.cpu_percent(),
        "gpu_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20
        if device.type == "cuda"
        else None,
    }


def non_finite_weights(model: torch.nn.Module) -> int:
    """How many parameter tensors hold a NaN or an infinity (the same on every rank: DDP keeps them
    equal)."""
    return sum(1 for p in model.parameters() if not torch.isfinite(p).all())


@dataclass
class StepResult:
    loss: float  # this worker's mean loss over its micro-batches
    hits: int  # correct top-1 predictions
    count: int  # predicted tokens
    grad_norm: float  # total gradient norm before clipping: the same on every rank


class Worker:
    """One DDP worker's model, optimizer and data, and the optimizer step (nanoGPT's inner loop)."""

    def __init__(self, spec: TrainSpec, run: RunContext, data: dict):
        self.spec, self.run = spec, run
        torch.set_num_threads(spec.train.cpus_per_worker)
        torch.manual_seed(spec.seed)
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.data = WorkerData(spec, data, self.rank, self.world)
        self.device = ray.train.torch.get_device()
        bf16 = spec.train.precision == "bf16" or (
            spec.train.precision == "auto" and self.device.type == "cuda"
        )
        cuda_bf16 = bf16 and self.device.type == "cuda"
        self.autocast = (
            (lambda: torch.autocast("cuda", dtype=torch.bfloat16))
            if cuda_bf16
            else contextlib.nullcontext
        )
        self.model = build_model(spec.model)
        if getattr(spec.model, "init_from", None):  # a GPT-2 checkpoint's weights (core/hf.py)
            hf.load_gpt2_weights(self.model, hf.read_gpt2_tensors(spec.model.init_from),
                                 spec.model.init_from)
        self.ddp_model = ray.train.torch.prepare_model(
            self.model
        )  # on the device; DDP when world > 1
        self.optimizer = make_optimizer(self.model, spec)
        self.forward = torch.compile(self.ddp_model) if spec.train.compile else self.ddp_model
        self.collate = WindowBatch(self.device)
        self.tokens_per_step = spec.train.batch_size * self.model.config.block_size
        self.process = psutil.Process()
        self.process.cpu_percent(), psutil.cpu_percent()  # start the CPU load measurements

    def restore(self) -> dict:
        """The training state to start from: Ray's latest checkpoint when it restarts this run's
        workers, else the checkpoint the run resumes, else step 0."""
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None and self.run.resume_from:
            filesystem, path = resolve(self.run.resume_from, self.spec.s3)
            checkpoint = Checkpoint(path, filesystem=filesystem)
        if checkpoint is None:
            return {"step": 0, "epoch": 0, "step_in_epoch": 0, "elapsed_s": 0.0}
        with checkpoint.as_directory() as d:
            return load_train_checkpoint(Path(d), self.model, self.optimizer)

    def train_step(self, group: list[np.ndarray], lr: float) -> StepResult:
        """Forward and backward over this worker's ``grad_accum`` micro-batches (DDP all-reduces the
        gradients on the last), clip, and step the optimizer unless the gradient norm is not
        finite."""
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        loss_sum, hits = 0.0, 0
        for i, windows in enumerate(group):
            x, y = self.collate(windows)
            sync = i == len(group) - 1 or not hasattr(self.ddp_model, "no_sync")
            with contextlib.nullcontext() if sync else self.ddp_model.no_sync():
                loss, h = _loss_and_hits(self.forward, x, y, self.autocast)
                (loss / self.spec.train.grad_accum).backward()
            loss_sum, hits = loss_sum + loss.item(), hits + h
        max_norm = self.spec.optim.grad_clip if self.spec.optim.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm).item()
        if math.isfinite(grad_norm):
            self.optimizer.step()
        return StepResult(loss_sum / len(group), hits, y.numel() * len(group), grad_norm)

    def metrics(
        self, interval: Interval, step: int, epoch: int, lr: float, elapsed_s: float
    ) -> dict:
        """The metrics.csv row of an evaluation: the interval's training figures (summed over the
        workers), the validation loss and accuracy, gradient statistics and system load."""
        spec, world = self.spec, self.world
        train_loss, train_hits, train_count = _all_reduce_sum(
            interval.loss, interval.hits, interval.count
        )
        val_loss, val_acc = evaluate(self.model, self.data, self.collate, self.autocast)
        windows_read, chunks_read = _all_reduce_max(self.data.epoch_reads["windows"],
                                                    self.data.epoch_reads["chunks"])
        tokens_per_s = interval.tokens_per_s(self.tokens_per_step)
        flops_per_token = self.model.flops_per_token()
        return {
            "step": step,
            "epoch": epoch,
            "tokens": step * self.tokens_per_step,
            "lr": lr,
            "train_loss": train_loss / world / interval.steps,
            "val_loss": val_loss,
            "val_ppl": math.exp(min(val_loss, 700)) if math.isfinite(val_loss) else val_loss,
            "val_bpc": val_loss / math.log(2) / spec.chars_per_token
            if spec.chars_per_token
            else None,
            "train_acc": train_hits / max(train_count, 1),
            "val_acc": val_acc,
            "grad_norm": interval.grad_norm / interval.steps,
            "tokens_per_s": tokens_per_s,
            "step_time_s": interval.step_s / interval.steps,
            "mfu": (flops_per_token * tokens_per_s / (spec.train.peak_flops * world))
            if spec.train.peak_flops
            else None,
            **system_stats(self.process, self.device),
            "elapsed_s": elapsed_s,
            "workers": world,
            "windows_read": int(windows_read),  # this epoch, the most any worker read
            "chunks_read": int(chunks_read),
        }


def divergence(metrics: dict, model: torch.nn.Module) -> str | None:
    """What is not finite at an evaluation (the training or validation loss, the weights), or None.
    Every rank finds the same: the losses are summed over the ranks and the weights are equal."""
    bad = [
        f"{key} {metrics[key]:.4g}"
        for key in ("train_loss", "val_loss")
        if not math.isfinite(metrics[key])
    ]
    tensors = non_finite_weights(model)
    if tensors:
        bad.append(f"{tensors} weight tensors with NaN or infinite values")
    return ", ".join(bad) or None


def train_loop(config: dict) -> None:
    """One DDP worker, as nanoGPT's loop: epoch after epoch, an optimizer step per group of
    micro-batches; every ``eval_interval`` steps an evaluation and a report (with a checkpoint
    every ``checkpoint_interval``). A divergence ends the run on every rank at the same step."""
    spec, run = config["spec"], config["run"]
    loop_start = time.time()
    worker = Worker(spec, run, config["data"])
    state = worker.restore()
    if worker.rank == 0 and run.board is not None:  # start-up, phase by phase (FitResult.startup)
        run.board.mark.remote("loop_start", loop_start)
        run.board.mark.remote("worker_ready", time.time())
    step, epoch = state["step"], state["epoch"]
    run_clock, interval = Stopwatch(already_s=state["elapsed_s"]), Interval()
    live = LivePosts(run.board, run.run_name) if worker.rank == 0 else None
    while step < spec.max_steps:
        for group in worker.data.steps(epoch, state["step_in_epoch"]):
            step_clock, lr = Stopwatch(), lr_at(step, spec)
            result = worker.train_step(group, lr)
            if live and live.first_step:
                run.board.mark.remote("first_step", time.time())
            step, state["step_in_epoch"] = step + 1, state["step_in_epoch"] + 1
            if not math.isfinite(result.grad_norm):  # every rank: the gradients were all-reduced
                _report_divergence(step, f"loss {result.loss:.4g}, gradient norm "
                                         f"{result.grad_norm:.4g}")
                return
            evaluate_now = step % spec.train.eval_interval == 0 or step == spec.max_steps
            grads = grad_stats(worker.model) if evaluate_now else {}
            worker.optimizer.zero_grad(set_to_none=True)
            interval.add(result, step_clock.seconds())
            if live:
                live.step(step, result.loss, interval.tokens_per_s(worker.tokens_per_step))
            if evaluate_now:
                metrics = worker.metrics(interval, step, epoch, lr, run_clock.seconds()) | grads
                state.update(step=step, epoch=epoch, elapsed_s=metrics["elapsed_s"])
                if not _reported(metrics, worker, state, live):
                    return
                interval = Interval()
            if step >= spec.max_steps:
                break
        else:  # the epoch is over
            epoch, state["step_in_epoch"] = epoch + 1, 0
    if live:
        run.board.mark.remote("last_step", time.time(), first=False)


def _reported(metrics: dict, worker: Worker, state: dict, live: LivePosts | None) -> bool:
    """An evaluation's report, with a checkpoint of ``state`` when one is due; False (and the
    divergence reported instead) when something in it is not finite."""
    bad = divergence(metrics, worker.model)
    if bad:
        _report_divergence(metrics["step"], bad)
        return False
    if live:
        live.evaluation(metrics["val_loss"])
    step, spec = metrics["step"], worker.spec
    interval = spec.train.checkpoint_interval
    keep = step == spec.max_steps or bool(interval and step % interval == 0)
    _report(metrics, worker, state if keep else None)
    return True


def _report_divergence(step: int, what: str) -> None:
    """Every rank reports the divergence (a barrier) and the run ends without another checkpoint."""
    ray.train.report({"step": step, "diverged": what})


def _report(metrics: dict, worker: Worker, state: dict | None) -> None:
    """``ray.train.report`` on every rank (it is a barrier); with ``state``, rank 0 attaches a
    checkpoint."""
    if state is None or worker.rank != 0:
        ray.train.report(metrics)
        return
    spec = worker.spec
    with tempfile.TemporaryDirectory() as tmp:
        save_train_checkpoint(
            Path(tmp),
            worker.model,
            tokenizer_from_json(spec.tokenizer_json),
            worker.optimizer,
            {
                **state,
                "fingerprint": spec.fingerprint,
                "max_steps": spec.max_steps,
                "world": worker.world,
            },
        )
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))


@dataclass
class FitResult:
    checkpoint: Checkpoint | None  # the last one Ray Train registered
    diverged: (
        dict | None
    )  # {"step", "what", "last_checkpoint"} when the run diverged (metrics.read_divergence)
    restarts: int  # worker-group restarts after lost workers
    resumed_from: str | None  # the checkpoint the run started from (RunContext.resume_from)
    marks: dict  # when (time.time()) fit began and ended, and rank 0 reached each start-up mark


def startup_phases(marks: dict) -> dict:
    """Seconds of each phase of Ray Train's start and stop, from ``FitResult.marks``: the worker
    group's start (fit called → train loop entered), the worker's set-up (model, optimizer,
    checkpoint), the first step, and the stop (last step → fit returned)."""
    spans = {"train_group_start_s": ("fit", "loop_start"),
             "worker_setup_s": ("loop_start", "worker_ready"),
             "first_step_s": ("worker_ready", "first_step"),
             "train_group_stop_s": ("last_step", "fit_end")}
    return {name: round(marks[b] - marks[a], 3) for name, (a, b) in spans.items()
            if a in marks and b in marks}


def fit(spec: TrainSpec, run: RunContext, data: dict, launch: Launch) -> FitResult:
    """Train on ``data`` = ``{split: (chunk source, ChunkIndex)}`` (from ``run.resume_from`` if
    set). Checkpoints
    go to ``launch.storage/<run>/`` (a directory or s3://). The console follows it live
    (progress.py); ``metrics.csv``, TensorBoard events and the restarts (``events.jsonl``) go to
    ``launch.out_dir``."""
    run = RunContext(run.run_name, ProgressBoard.remote(), run.resume_from)
    filesystem, storage_path = resolve(launch.storage, spec.s3)
    recorder = MetricsWriter(launch.out_dir)
    train = spec.train
    workers = (train.min_workers, train.num_workers) if train.min_workers else train.num_workers
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"spec": spec, "run": run, "data": data},
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=train.use_gpu,
            placement_strategy=launch.placement or "PACK",
            resources_per_worker={"CPU": spec.train.cpus_per_worker},
        ),
        run_config=RunConfig(
            name=run.run_name,
            storage_path=storage_path,
            storage_filesystem=filesystem,
            checkpoint_config=CheckpointConfig(num_to_keep=train.keep_checkpoints),
            failure_config=FailureConfig(max_failures=train.max_failures),
            callbacks=[recorder, RestartRecorder(recorder)],
        ),
    )
    progress = TrainingProgress(run.board, launch.out_dir, spec.max_steps, train.max_failures,
                                on_row=launch.on_metrics)
    progress.start()
    sigint_handler = signal.getsignal(signal.SIGINT)
    marks = {"fit": time.time()}
    try:
        result = trainer.fit()
        marks |= ray.get(run.board.read_marks.remote()) | {"fit_end": time.time()}
    except SystemExit as err:  # Ray Train's SIGINT handler aborts the run, then exits with status 0
        raise KeyboardInterrupt from err
    finally:
        progress.stop()
        ray.kill(run.board)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, sigint_handler)
    diverged = read_divergence(launch.out_dir)
    if result.checkpoint is None and diverged is None:
        raise RuntimeError("training finished without a checkpoint; see "
                           f"{launch.storage}/{run.run_name}")
    restarts = sum(1 for event in read_events(launch.out_dir) if event["event"] == "restart")
    return FitResult(result.checkpoint, diverged, restarts, run.resume_from, marks)
