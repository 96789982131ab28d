"""Training with Ray Train: a ``TorchTrainer`` runs ``train_loop`` on every DDP worker.

Data order is fixed by the seed, whatever the dataset's blocks: every worker reads the whole (ETL-shuffled)
window stream in order, permutes each ``shuffle_buffer`` windows with a seed from (seed, epoch, chunk), and
takes micro-batch ``j`` when ``j % world == rank``. A checkpoint stores the step and the epoch, so a resumed
run skips exactly the micro-batches already trained on and continues as if never stopped.

Every ``eval_interval`` steps all ranks report metrics (``ray.train.report`` is a barrier); every
``checkpoint_interval`` steps and at the end rank 0 attaches a training checkpoint (see checkpoint.py).
"""

from __future__ import annotations

import contextlib
import math
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointConfig, DataConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raydp_llm.checkpoint import load_train_checkpoint, save_train_checkpoint
from raydp_llm.metrics import MetricsWriter
from raydp_llm.model import LanguageModel, build_model
from raydp_llm.progress import LivePosts, ProgressBoard, TrainingProgress
from raydp_llm.storage import S3Options, resolve
from raydp_llm.tokenizer import tokenizer_from_json


@dataclass
class TrainSpec:
    """Everything a worker needs, as plain values (workers do not see Hydra)."""

    model: dict  # build_model's spec: kind, config fields (vocab_size included), init/freeze embeddings
    tokenizer_json: str
    token_dtype: str
    chars_per_token: float | None  # for bits per character; None for pre-tokenized ids
    micro_batch: int  # windows per forward pass on one worker
    grad_accum: int  # micro-batches per optimizer step on each worker
    max_steps: int
    steps_per_epoch: int
    eval_interval: int
    eval_batches: int | None  # micro-batches per worker per evaluation; None: the whole validation split
    checkpoint_interval: int  # steps between checkpoints (a multiple of eval_interval); 0: only the last
    lr: float
    min_lr: float
    warmup_steps: int
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float
    seed: int
    cpus_per_worker: int
    shuffle_buffer: int
    precision: str  # auto | fp32 | bf16 (bf16 autocast on GPU only)
    compile: bool
    peak_flops: float | None  # one worker's peak FLOP/s, for MFU
    fingerprint: str  # identifies runs that may resume each other's checkpoints
    resume_from: str | None = None  # a training checkpoint directory (local or s3://) to start from
    s3: S3Options = S3Options()  # how to reach s3:// paths
    run_name: str = ""  # the Ray Train run's name, which tags its Ray metrics
    board: object = None  # the driver's ProgressBoard actor (progress.py), which rank 0 posts to


def steps_per_epoch(windows: int, micro_batch: int, world: int, grad_accum: int) -> int:
    """Optimizer steps in one pass over ``windows`` (an incomplete last step is dropped)."""
    return windows // micro_batch // (world * grad_accum)


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr`` at ``max_steps``."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = min(1.0, (step - spec.warmup_steps) / max(1, spec.max_steps - spec.warmup_steps))
    return spec.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (spec.lr - spec.min_lr)


def make_optimizer(model: torch.nn.Module, spec: TrainSpec) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, LayerNorm gains); frozen parameters left out."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(spec.beta1, spec.beta2))


class WindowBatch:
    """Raw window bytes (an array of ``block_size + 1`` ids each) → (inputs, targets), each (B, T) int64."""

    def __init__(self, dtype: str, block_size: int, device: torch.device):
        self.dtype, self.width, self.device = np.dtype(dtype), block_size + 1, device

    def __call__(self, windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w = np.frombuffer(b"".join(windows), dtype=self.dtype).reshape(-1, self.width)
        w = torch.from_numpy(w.astype(np.int64)).to(self.device, non_blocking=True)
        return w[:, :-1], w[:, 1:]


def shuffled_micro_batches(shard, micro_batch: int, buffer: int, seed: int, epoch: int):
    """The epoch's window stream in micro-batches: read in order, each ``buffer`` windows permuted by a seeded
    RNG. Only row order matters, not how Ray cut the dataset into blocks. No prefetching: a chunk lasts many
    steps, and a prefetch thread steals CPU from torch's threads (0.73× → 0.95× a bare loop's speed on 2 cores)."""
    pending, chunk = np.empty(0, dtype=object), 0
    for batch in shard.iter_batches(batch_size=max(buffer, micro_batch), batch_format="numpy", prefetch_batches=0):
        windows = batch["tokens"]
        if buffer:
            windows = windows[np.random.default_rng([seed, epoch, chunk]).permutation(len(windows))]
        pending, chunk = np.concatenate([pending, windows]), chunk + 1
        while len(pending) >= micro_batch:
            yield pending[:micro_batch]
            pending = pending[micro_batch:]


def epoch_steps(shard, spec: TrainSpec, epoch: int, first_step: int, rank: int, world: int):
    """This worker's micro-batches for the optimizer steps ``first_step..`` of ``epoch``, ``grad_accum`` at a time:
    global micro-batch ``j`` belongs to step ``j // (world * grad_accum)`` and to rank ``j % world``."""
    per_step = world * spec.grad_accum
    first, end = first_step * per_step, spec.steps_per_epoch * per_step
    group = []
    for j, windows in enumerate(shuffled_micro_batches(shard, spec.micro_batch, spec.shuffle_buffer, spec.seed,
                                                       epoch)):
        if j >= end:
            return
        if j >= first and j % world == rank:
            group.append(windows)
            if len(group) == spec.grad_accum:
                yield group
                group = []


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
def evaluate(model: torch.nn.Module, shard, collate: WindowBatch, spec: TrainSpec, rank: int, world: int,
             autocast) -> tuple[float, float]:
    """Validation loss (per token) and top-1 accuracy over ``eval_batches`` micro-batches per worker (all if
    None), always the same ones, summed over the workers."""
    model.eval()
    loss_sum = hits = count = 0
    limit = None if spec.eval_batches is None else spec.eval_batches * world
    for i, batch in enumerate(shard.iter_batches(batch_size=spec.micro_batch, batch_format="numpy")):
        if limit is not None and i >= limit:
            break
        if i % world == rank:
            x, y = collate(batch["tokens"])
            loss, h = _loss_and_hits(model, x, y, autocast)
            loss_sum, hits, count = loss_sum + loss.item() * y.numel(), hits + h, count + y.numel()
    model.train()
    loss_sum, hits, count = _all_reduce_sum(loss_sum, hits, count)
    return loss_sum / max(count, 1), hits / max(count, 1)


class Interval:
    """What happens between two reports: losses, hits, gradient norms, step times."""

    def __init__(self):
        self.loss = self.hits = self.count = self.grad_norm = self.step_s = 0.0
        self.steps, self.start = 0, time.perf_counter()

    def add(self, loss: float, hits: int, count: int, grad_norm: float, step_s: float) -> None:
        self.loss, self.hits, self.count = self.loss + loss, self.hits + hits, self.count + count
        self.grad_norm, self.step_s, self.steps = self.grad_norm + grad_norm, self.step_s + step_s, self.steps + 1


def grad_stats(model: torch.nn.Module) -> dict:
    """Mean, min, max and variance of the gradients' magnitudes (the DL4J projects' gradient statistics)."""
    g = torch.cat([p.grad.detach().abs().flatten().float() for p in model.parameters() if p.grad is not None])
    return {"grad_abs_mean": g.mean().item(), "grad_abs_min": g.min().item(), "grad_abs_max": g.max().item(),
            "grad_abs_var": g.var().item()}


def system_stats(process: psutil.Process, device: torch.device) -> dict:
    """This worker's memory and CPU load, the node's, and GPU memory when on a GPU."""
    mem = psutil.virtual_memory()
    return {
        "rss_mb": process.memory_info().rss / 2**20,
        "sys_mem_used_mb": (mem.total - mem.available) / 2**20, "sys_mem_total_mb": mem.total / 2**20,
        "cpu_percent": process.cpu_percent(), "sys_cpu_percent": psutil.cpu_percent(),
        "gpu_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
    }


def train_loop(spec_dict: dict) -> None:
    spec = TrainSpec(**spec_dict)
    torch.set_num_threads(spec.cpus_per_worker)
    torch.manual_seed(spec.seed)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    bf16 = spec.precision == "bf16" or (spec.precision == "auto" and device.type == "cuda")
    autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 and device.type == "cuda"
                else contextlib.nullcontext)

    model = build_model(spec.model)
    ddp_model = ray.train.torch.prepare_model(model)  # on the device; DDP when world > 1
    optimizer = make_optimizer(model, spec)
    state = {"step": 0, "epoch": 0, "step_in_epoch": 0, "elapsed_s": 0.0}
    # Ray's own checkpoint when it restarts failed workers; else the one this run resumes, if any.
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and spec.resume_from:
        filesystem, path = resolve(spec.resume_from, spec.s3)
        checkpoint = Checkpoint(path, filesystem=filesystem)
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = load_train_checkpoint(Path(d), model, optimizer)
    forward = torch.compile(ddp_model) if spec.compile else ddp_model
    collate = WindowBatch(spec.token_dtype, model.config.block_size, device)
    train_shard, val_shard = ray.train.get_dataset_shard("train"), ray.train.get_dataset_shard("val")
    tokens_per_step = spec.micro_batch * spec.grad_accum * world * model.config.block_size
    flops_per_token, process = model.flops_per_token(), psutil.Process()
    process.cpu_percent(), psutil.cpu_percent()  # start the CPU load measurements

    step, epoch, elapsed = state["step"], state["epoch"], state["elapsed_s"]
    interval, run_start = Interval(), time.perf_counter() - elapsed
    live = LivePosts(spec.board, spec.run_name) if rank == 0 else None
    while step < spec.max_steps:
        for group in epoch_steps(train_shard, spec, epoch, state["step_in_epoch"], rank, world):
            t = time.perf_counter()
            lr = lr_at(step, spec)
            for g in optimizer.param_groups:
                g["lr"] = lr
            loss_sum = hits = 0.0
            for i, windows in enumerate(group):
                x, y = collate(windows)
                sync = i == len(group) - 1 or not hasattr(ddp_model, "no_sync")
                with contextlib.nullcontext() if sync else ddp_model.no_sync():
                    loss, h = _loss_and_hits(forward, x, y, autocast)
                    (loss / spec.grad_accum).backward()
                loss_sum, hits = loss_sum + loss.item(), hits + h
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                       spec.grad_clip if spec.grad_clip > 0 else math.inf)
            report_now = (step + 1) % spec.eval_interval == 0 or step + 1 == spec.max_steps
            grads = grad_stats(model) if report_now else {}
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step, state["step_in_epoch"] = step + 1, state["step_in_epoch"] + 1
            interval.add(loss_sum / len(group), hits, y.numel() * len(group), grad_norm.item(),
                         time.perf_counter() - t)
            now = time.perf_counter()
            if live:
                live.step(now, step, loss_sum / len(group), interval.steps * tokens_per_step / (now - interval.start))
            if report_now:
                train_loss, train_hits, train_count = _all_reduce_sum(interval.loss, interval.hits, interval.count)
                val_loss, val_acc = evaluate(model, val_shard, collate, spec, rank, world, autocast)
                tokens_per_s = interval.steps * tokens_per_step / (now - interval.start)
                metrics = {
                    "step": step, "epoch": epoch, "tokens": step * tokens_per_step, "lr": lr,
                    "train_loss": train_loss / world / interval.steps, "val_loss": val_loss,
                    "val_ppl": math.exp(min(val_loss, 700)),
                    "val_bpc": val_loss / math.log(2) / spec.chars_per_token if spec.chars_per_token else None,
                    "train_acc": train_hits / max(train_count, 1), "val_acc": val_acc,
                    "grad_norm": interval.grad_norm / interval.steps, **grads,
                    "tokens_per_s": tokens_per_s, "step_time_s": interval.step_s / interval.steps,
                    "mfu": (flops_per_token * tokens_per_s / (spec.peak_flops * world)) if spec.peak_flops else None,
                    **system_stats(process, device), "elapsed_s": now - run_start,
                }
                state.update(step=step, epoch=epoch, elapsed_s=metrics["elapsed_s"])
                if live:
                    live.evaluation(val_loss)
                keep = step == spec.max_steps or (spec.checkpoint_interval and step % spec.checkpoint_interval == 0)
                _report(metrics, model, optimizer, spec, state if keep else None, rank)
                interval = Interval()
            if step >= spec.max_steps:
                break
        else:  # the epoch is over
            epoch, state["step_in_epoch"] = epoch + 1, 0


def _report(metrics: dict, model: LanguageModel, optimizer, spec: TrainSpec, state: dict | None, rank: int) -> None:
    """``ray.train.report`` on every rank (it is a barrier); with ``state``, rank 0 attaches a checkpoint."""
    if state is None or rank != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        save_train_checkpoint(Path(tmp), model, tokenizer_from_json(spec.tokenizer_json), optimizer,
                              {**state, "fingerprint": spec.fingerprint, "max_steps": spec.max_steps})
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))


def _in_order():
    options = DataConfig.default_ingest_options()
    options.preserve_order = True
    return options


def fit(spec: TrainSpec, datasets: dict, num_workers: int, use_gpu: bool, out_dir: Path, run_name: str,
        keep_checkpoints: int, storage: str, placement: str | None) -> Checkpoint:
    """Train on the Ray datasets ``{"train", "val"}`` (from ``spec.resume_from`` if set); returns the final
    checkpoint. Checkpoints go to ``storage/<run>/`` (a directory or s3://), the workers are placed by ``placement``
    (PACK when None). The console follows it live (progress.py); ``metrics.csv`` and TensorBoard events go to
    ``out_dir``."""
    spec.run_name = f"{run_name}-{time.strftime('%Y%m%d-%H%M%S')}"  # unique: never Ray's silent resume
    spec.board = ProgressBoard.remote()
    filesystem, storage_path = resolve(storage, spec.s3)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=vars(spec),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, placement_strategy=placement or "PACK",
                                     resources_per_worker={"CPU": spec.cpus_per_worker}),
        datasets=datasets,
        # Every worker reads the whole stream, in order, and takes its own micro-batches (see epoch_steps).
        dataset_config=DataConfig(datasets_to_split=[], execution_options=_in_order()),
        run_config=RunConfig(name=spec.run_name, storage_path=storage_path, storage_filesystem=filesystem,
                             checkpoint_config=CheckpointConfig(num_to_keep=keep_checkpoints),
                             callbacks=[MetricsWriter(out_dir / "metrics.csv", out_dir / "tensorboard")]),
    )
    progress = TrainingProgress(spec.board, out_dir / "metrics.csv", spec.max_steps)
    progress.start()
    sigint_handler = signal.getsignal(signal.SIGINT)
    try:
        result = trainer.fit()
    except SystemExit as err:  # Ray Train's SIGINT handler aborts the run, then exits with status 0
        raise KeyboardInterrupt from err
    finally:
        progress.stop()
        ray.kill(spec.board)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, sigint_handler)
    if result.checkpoint is None:
        raise RuntimeError(f"training finished without a checkpoint; see {storage}/{spec.run_name}")
    return result.checkpoint
