"""Training with Ray Train: a ``TorchTrainer`` runs ``train_loop`` on every DDP worker.

Workers read their shard of the window datasets, train with AdamW (warmup + cosine), evaluate every
``eval_interval`` steps and report metrics; rank 0 writes the final model directory as the checkpoint.
"""

from __future__ import annotations

import math
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raydp_llm.checkpoint import save_model_dir
from raydp_llm.metrics import MetricsCsv, MetricsFollower
from raydp_llm.model import LanguageModel, build_model
from raydp_llm.tokenizer import tokenizer_from_json


@dataclass
class TrainSpec:
    """Everything a worker needs, as plain values (workers do not see Hydra)."""

    model: dict  # build_model's spec: kind, config fields (vocab_size included), init/freeze embeddings
    tokenizer_json: str
    token_dtype: str
    batch_size: int  # per worker
    max_steps: int
    eval_interval: int
    eval_batches: int | None  # None: the whole validation split
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


class WindowBatch:
    """collate_fn: a batch of raw window bytes → (inputs, targets), each (B, block_size) int64."""

    def __init__(self, dtype: str, block_size: int):
        self.dtype, self.width = np.dtype(dtype), block_size + 1

    def __call__(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        w = np.frombuffer(b"".join(batch["tokens"]), dtype=self.dtype).reshape(-1, self.width)
        w = torch.from_numpy(w.astype(np.int64))
        return w[:, :-1], w[:, 1:]


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr`` at ``max_steps``."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = min(1.0, (step - spec.warmup_steps) / max(1, spec.max_steps - spec.warmup_steps))
    return spec.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (spec.lr - spec.min_lr)


def make_optimizer(model: torch.nn.Module, spec: TrainSpec) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, LayerNorm gains)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(spec.beta1, spec.beta2))


def _all_reduce_sum(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate(model: torch.nn.Module, shard, collate: WindowBatch, batch_size: int, max_batches: int | None) -> float:
    """Mean validation loss over this worker's shard, averaged over all workers by token count."""
    model.eval()
    loss_sum, count = 0.0, 0
    for i, (x, y) in enumerate(shard.iter_torch_batches(batch_size=batch_size, collate_fn=collate)):
        if max_batches is not None and i >= max_batches:
            break
        _, loss = model(x, y)
        loss_sum, count = loss_sum + loss.item() * y.numel(), count + y.numel()
    model.train()
    loss_sum, count = _all_reduce_sum(loss_sum, count)
    return loss_sum / max(count, 1)


def train_loop(spec_dict: dict) -> None:
    spec = TrainSpec(**spec_dict)
    torch.set_num_threads(spec.cpus_per_worker)
    torch.manual_seed(spec.seed)
    rank = ray.train.get_context().get_world_rank()
    world = ray.train.get_context().get_world_size()

    model = build_model(spec.model)
    ddp_model = ray.train.torch.prepare_model(model)
    optimizer = make_optimizer(model, spec)
    collate = WindowBatch(spec.token_dtype, model.config.block_size)
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val")
    tokens_per_step = spec.batch_size * world * model.config.block_size

    step, epoch, start = 0, 0, time.perf_counter()
    window_loss, window_steps, window_start = 0.0, 0, start
    while step < spec.max_steps:
        batches = train_shard.iter_torch_batches(
            batch_size=spec.batch_size, collate_fn=collate, drop_last=True,
            local_shuffle_buffer_size=spec.shuffle_buffer or None, local_shuffle_seed=spec.seed + epoch)
        for x, y in batches:
            lr = lr_at(step, spec)
            for group in optimizer.param_groups:
                group["lr"] = lr
            _, loss = ddp_model(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if spec.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
            optimizer.step()
            step += 1
            window_loss, window_steps = window_loss + loss.item(), window_steps + 1
            if step % spec.eval_interval == 0 or step == spec.max_steps:
                now = time.perf_counter()
                train_loss = _all_reduce_sum(window_loss / window_steps)[0] / world
                metrics = {
                    "step": step, "epoch": epoch, "tokens": step * tokens_per_step,
                    "train_loss": train_loss,
                    "val_loss": evaluate(model, val_shard, collate, spec.batch_size, spec.eval_batches),
                    "lr": lr, "tokens_per_s": window_steps * tokens_per_step / (now - window_start),
                    "elapsed_s": now - start,
                }
                _report(metrics, model, spec, final=step == spec.max_steps, rank=rank)
                window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
            if step >= spec.max_steps:
                break
        epoch += 1


def _report(metrics: dict, model: LanguageModel, spec: TrainSpec, final: bool, rank: int) -> None:
    """``ray.train.report`` on every rank (it is a barrier); rank 0 attaches the model dir at the end."""
    if not (final and rank == 0):
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        save_model_dir(Path(tmp), model, tokenizer_from_json(spec.tokenizer_json))
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))


def fit(spec: TrainSpec, datasets: dict, num_workers: int, use_gpu: bool, out_dir: Path, run_name: str) -> Checkpoint:
    """Train on the Ray datasets ``{"train", "val"}``; returns the final checkpoint (a model directory)."""
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=vars(spec),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": spec.cpus_per_worker}),
        datasets=datasets,
        run_config=RunConfig(name=run_name, storage_path=str(out_dir / "ray_results"),
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             callbacks=[MetricsCsv(out_dir / "metrics.csv")]),
    )
    follower = MetricsFollower(out_dir / "metrics.csv", spec.max_steps)
    follower.start()
    sigint_handler = signal.getsignal(signal.SIGINT)
    try:
        result = trainer.fit()
    except SystemExit as err:  # Ray Train's SIGINT handler aborts the run, then exits with status 0
        raise KeyboardInterrupt from err
    finally:
        follower.stop()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, sigint_handler)
    if result.checkpoint is None:
        raise RuntimeError(f"training finished without a checkpoint; see {out_dir / 'ray_results'}")
    return result.checkpoint
