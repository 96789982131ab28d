"""One worker's side of training, in plain torch (``Worker``): its model, started and placed
(wrapped for DDP, or sharded), the reference model its objective asks for, its optimizer and
checkpoints. The objective (objectives/: lm, dpo, grpo, picked by ``train.objective``) takes the
worker's share of the data and makes each optimizer step and an evaluation's figures with them.

Nothing here asks Ray. Ray Train's entry (``loop.train_loop``) gives the worker its placement and
the function that wraps its model for DDP, so a test trains a worker in one CPU process. The
collectives are DDP's gradient all-reduce in the step, and an evaluation's ``all_reduce_sum`` and
``all_reduce_max`` (objectives/__init__.py), which go through ``torch.distributed`` only when it is
initialized (with one process there is nothing to reduce).
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
import torch

from raydp_llm.checkpoint.checkpointer import Checkpointer
from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.core.model_config import uses_lora
from raydp_llm.training.objectives import Interval, Placement, StepResult
from raydp_llm.training.objectives.dpo import Preference
from raydp_llm.training.objectives.grpo import Grpo
from raydp_llm.training.objectives.lm import LanguageModeling
from raydp_llm.training.objectives.reference import frozen, frozen_copy
from raydp_llm.training.spec import TrainSpec
from raydp_llm.training.tasks import HarnessSettings, run_tasks
from raydp_llm.training.tasks import columns as task_columns
from raydp_llm.training.worker import parallel, sharded_start
from raydp_llm.training.worker.optim import make_optimizer
from raydp_llm.training.worker.starting import starting_model


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


def autocast_for(precision: str, device: torch.device, strategy: str) -> Callable:
    """bf16 autocast on a GPU (``train.precision`` bf16, or auto) with DDP; fp32 otherwise (FSDP
    casts the parameters themselves: ``parallel.shard``)."""
    bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    if bf16 and device.type == "cuda" and strategy == "ddp":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


OBJECTIVES = {"lm": LanguageModeling, "dpo": Preference, "grpo": Grpo}  # by train.objective


class Worker:
    """One worker's model, optimizer and checkpoints, lent to its objective as a ``Trainee``
    (objectives/__init__.py), which makes each optimizer step and its evaluations' figures.
    With ``train.strategy=ddp``, ``prepare`` puts the model on the device and wraps it for DDP
    (``ray.train.torch.prepare_model`` in a run; without it the model is only moved to the
    device); with fsdp the model is sharded over the workers (``parallel.shard``:
    torch.distributed must be initialized)."""

    def __init__(self, spec: TrainSpec, data: dict, placement: Placement,
                 prepare: Callable[[torch.nn.Module], torch.nn.Module] | None = None):
        self.spec, self.placement, self.device = spec, placement, placement.device
        torch.set_num_threads(spec.train.cpus_per_worker)
        torch.manual_seed(spec.seed)
        train, kind = spec.train, OBJECTIVES[spec.train.objective]
        self.autocast = autocast_for(train.precision, self.device, train.strategy)
        self.model = self._starting_model()
        # before the model is wrapped or sharded
        self.reference = self._reference(self.model) if kind.wants_reference(spec) else None
        self.ddp_model = self._placed(self.model, prepare)
        self.sharded = parallel.is_sharded(self.model)
        self.checkpoints = Checkpointer.for_run(train, spec.model)
        self.optimizer = make_optimizer(self.model, spec)
        self.forward = torch.compile(self.ddp_model) if train.compile else self.ddp_model
        self.objective = kind(self, data)
        self.data = self.objective.data
        self.process = psutil.Process()
        self.process.cpu_percent(), psutil.cpu_percent()  # start the CPU load measurements

    @property
    def tokens_per_step(self) -> float:
        return self.objective.tokens_per_step

    def _starting_model(self) -> torch.nn.Module:
        """The starting weights: loaded shard by shard under FSDP from a transformers directory
        (``sharded_start``: already sharded), else built or loaded whole."""
        if sharded_start.applies(self.spec):
            return sharded_start.sharded_model(self.spec, self.device)
        return starting_model(self.spec)

    def _reference(self, model: torch.nn.Module) -> torch.nn.Module:
        """The starting weights, frozen, for an objective that measures against them: with
        LoRA, ``model`` itself (its adapters switched off: ``reference.reference_weights``); else
        a frozen copy of it, placed as it is (sharded under FSDP)."""
        spec = self.spec
        if uses_lora(spec.model):
            return model
        if parallel.is_sharded(model):  # loaded shard by shard: so is the reference
            return frozen(self._starting_model())
        copy_ = frozen_copy(model)
        if spec.train.strategy == "fsdp":
            copy_ = parallel.shard(copy_, self.device, spec.train.precision)
        return copy_.to(self.device)

    def _placed(self, model: torch.nn.Module, prepare) -> torch.nn.Module:
        """``model`` on the device: sharded in place (fsdp: the result is ``model``), or as
        ``prepare`` wraps it (DDP when world > 1)."""
        train = self.spec.train
        if parallel.is_sharded(model):  # sharded as it was loaded (``sharded_start``)
            return model
        if train.activation_checkpointing:
            parallel.checkpoint_activations(model)
        if train.strategy == "fsdp":
            return parallel.shard(model, self.device, train.precision)
        prepare = prepare or (lambda m: m.to(self.device))
        return prepare(model)

    def accumulating(self, last: bool):
        """``Trainee.accumulating``: DDP's ``no_sync`` (FSDP2's) unless ``last``."""
        if last:
            return contextlib.nullcontext()
        return parallel.gradients_accumulated(self.ddp_model)

    def backward(self, share: torch.Tensor) -> None:
        """``Trainee.backward``. DDP (Ray Train's ``prepare_model``) and FSDP2 (``parallel.shard``)
        average the workers' gradients: ``share`` times the number of workers makes that average
        the sum of the parts' gradients, the whole loss's."""
        (share * self.placement.world_size).backward()

    def update(self) -> float:
        """The gradients clipped to ``optim.grad_clip`` and the optimizer's step, unless their norm
        is not finite; that norm before clipping (the same on every rank)."""
        max_norm = self.spec.optim.grad_clip if self.spec.optim.grad_clip > 0 else math.inf
        grad_norm = parallel.as_float(
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        return grad_norm

    def clear_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def writes_checkpoints(self) -> bool:
        """Whether this worker writes (a part of) each checkpoint: rank 0, or every worker."""
        return self.checkpoints.writes(self.placement.rank)

    def load_checkpoint(self, directory: Path) -> TrainState:
        """Weights, optimizer and RNG from a training checkpoint (and what the objective keeps in
        it: a precomputed reference's log-probabilities); the state it was taken at."""
        self.objective.load(directory)
        return self.checkpoints.load(directory, self.model, self.optimizer)

    def save_checkpoint(self, directory: Path, state: TrainState) -> None:
        """A training checkpoint at ``state`` (this worker's part of it when sharded), stamped with
        the run's fingerprint, ``max_steps`` and number of workers, and the objective's own."""
        spec = self.spec
        stamped = replace(state, fingerprint=spec.fingerprint, max_steps=spec.max_steps,
                          world=self.placement.world_size)
        self.objective.save(directory, self.placement.rank)  # before the seal, which lists it
        self.checkpoints.save(directory, self.model, spec.tokenizer(), self.optimizer, stamped)

    def task_columns(self, checkpoint: Path, step: int) -> dict:
        """``train.eval_tasks`` scored on the model of the checkpoint just written, when due at
        ``step``, as ``metrics.csv`` columns, by rank 0 (every worker gathers a sharded model's
        shards first); nothing on other ranks (they wait in the report that follows)."""
        t, spec = self.spec.train, self.spec
        if not t.eval_tasks or (t.task_interval is not None and step % t.task_interval):
            return {}
        with tempfile.TemporaryDirectory() as out:  # the gathered model, the GPT-2 export
            model_dir = self.checkpoints.model_dir_of(
                checkpoint, self.model, Path(out) / "model", spec.model, spec.tokenizer(),
                self.placement.rank, spec.s3)
            if model_dir is None:
                return {}
            harness = HarnessSettings(limit=t.task_limit, seed=spec.seed)
            found = run_tasks(t.eval_tasks, model_dir, Path(out), harness, spec.s3)
            return task_columns(found["tasks"])

    def start(self, state: TrainState) -> None:
        """What the objective makes before the first step (dpo.reference=precomputed's table)."""
        self.objective.start(state)

    def train_step(self, group: list, lr: float, step: int = 0) -> StepResult:
        """The optimizer step ``step`` (its number; the data knows it already) on this worker's
        part of it: ``group`` (micro-batches of windows; grpo: prompts), at learning rate
        ``lr``."""
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        return self.objective.step(group, step)

    def metrics(self, interval: Interval, state: TrainState, lr: float) -> dict:
        """The metrics.csv row of an evaluation at ``state``: the objective's columns (the
        interval's figures and a validation pass, over every worker), the gradient norm and step
        time, and system load."""
        row = self.objective.columns(interval, state)
        return {
            "step": state.step,
            "epoch": state.epoch,
            "lr": lr,
            **row,
            "grad_norm": interval.grad_norm / interval.steps,
            "step_time_s": interval.step_s / interval.steps,
            **system_stats(self.process, self.device),
            "elapsed_s": state.elapsed_s,
            "workers": self.placement.world_size,
        }
