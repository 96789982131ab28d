"""One DDP worker's side of training, in plain torch: where it runs (``Placement``), its windows
(``WorkerData``), its model and optimizer, the optimizer step and an evaluation's metrics row
(``Worker``).

Nothing here asks Ray. Ray Train's entry (``loop.train_loop``) gives the worker its placement and
the function that wraps its model for DDP, so a test trains a worker in one CPU process. The
collectives are DDP's gradient all-reduce in the step, and an evaluation's ``all_reduce_sum`` and
``all_reduce_max``, which go through ``torch.distributed`` only when it is initialized (with one
process there is nothing to reduce).
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.distributed as dist

from raydp_llm.checkpoint.checkpointer import Checkpointer
from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.core.errors import RunFailure
from raydp_llm.core.model_config import uses_lora
from raydp_llm.core.timing import Stopwatch
from raydp_llm.data.batches import Batch, WindowBatch
from raydp_llm.models.base import IGNORE
from raydp_llm.training import parallel, sharded_start
from raydp_llm.training.metrics import bits_per_char
from raydp_llm.training.objectives import (
    LanguageModeling,
    Preference,
    frozen,
    frozen_copy,
    logps_of,
    reference_of,
)
from raydp_llm.training.optim import make_optimizer
from raydp_llm.training.precomputed import PrecomputedReference, starting_stamp
from raydp_llm.training.reference import starting_model
from raydp_llm.training.spec import TrainSpec
from raydp_llm.training.tasks import HarnessSettings, run_tasks
from raydp_llm.training.tasks import columns as task_columns
from raydp_llm.training.worker_data import ValWindows, WorkerData


@dataclass(frozen=True)
class Placement:
    """Where a worker runs: its rank among ``world_size`` workers, its rank on its node, its
    device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def all_reduce_sum(*values: float) -> list[float]:
    """``values`` summed over the workers (as they are with one process)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(*values: float) -> list[float]:
    """The largest of each of ``values`` over the workers."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def idle_batch(block_size: int, device: torch.device) -> Batch:
    """A batch of one pair of rows whose targets all are ``IGNORE``: a forward that counts
    nothing (a sharded model's workers run as many forwards each)."""
    inputs = torch.zeros((2, block_size), dtype=torch.long, device=device)
    return Batch(inputs, torch.full_like(inputs, IGNORE), None)


@torch.no_grad()
def validation_pass(model: torch.nn.Module, data: WorkerData | ValWindows,
                    collate: WindowBatch,
                    autocast, objective=LanguageModeling()) -> list[float]:
    """Over this worker's share of the validation windows: the summed loss, the hits and what
    they count (lm: nats, top-1 predictions right, predicted tokens; dpo: per pair, pairs ranked
    right, pairs), then the sums of the objective's ``figures``."""
    model.eval()
    loss_sum = hits = count = 0
    figures = dict.fromkeys(objective.figures, 0.0)
    for windows in data.val_batches():
        scored = objective.score(model, collate(windows), autocast)
        loss_sum += scored.loss.item() * scored.count
        hits, count = hits + scored.hits, count + scored.count
        figures = {k: v + scored.sums[k] for k, v in figures.items()}
    even_forwards(model, data.val_batch_count(), collate.device,
                  lambda idle: objective.score(model, idle, autocast))
    model.train()
    return [loss_sum, hits, count, *figures.values()]


def even_forwards(model: torch.nn.Module, mine: int, device: torch.device,
                  forward: Callable[[Batch], object]) -> None:
    """A sharded model's forwards gather its parameters on every worker, so each runs as many:
    this worker, having run ``mine``, runs ``forward`` on idle batches (counting nothing) up to
    the most any worker ran. Nothing for a model that is not sharded."""
    if not parallel.is_sharded(model):
        return
    idle = idle_batch(model.config.block_size, device)
    for _ in range(int(all_reduce_max(mine)[0]) - mine):
        forward(idle)


@dataclass
class StepResult:
    loss: float  # this worker's mean loss over its micro-batches
    hits: int  # correct top-1 predictions
    count: int  # predicted tokens the loss counts
    grad_norm: float  # total gradient norm before clipping: the same on every rank
    sums: dict[str, float] = field(default_factory=dict)  # the objective's figures, summed


class Interval:
    """What happens between two reports: losses, hits, gradient norms, step times, the
    objective's figures."""

    def __init__(self):
        self.loss = self.hits = self.count = self.grad_norm = self.step_s = 0.0
        self.steps, self.clock = 0, Stopwatch()
        self.sums: dict[str, float] = {}

    def add(self, step: StepResult, step_s: float) -> None:
        self.loss += step.loss
        self.hits += step.hits
        self.count += step.count
        self.sums = {k: self.sums.get(k, 0.0) + v for k, v in step.sums.items()}
        self.grad_norm += step.grad_norm
        self.step_s += step_s
        self.steps += 1

    def tokens_per_s(self, tokens_per_step: int) -> float:
        return self.steps * tokens_per_step / self.clock.seconds()


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


class Worker:
    """One worker's model, optimizer and data, and the optimizer step (nanoGPT's inner loop).
    With ``train.strategy=ddp``, ``prepare`` puts the model on the device and wraps it for DDP
    (``ray.train.torch.prepare_model`` in a run; without it the model is only moved to the device);
    with fsdp the model is sharded over the workers (``parallel.shard``: torch.distributed must be
    initialized)."""

    def __init__(self, spec: TrainSpec, data: dict, placement: Placement,
                 prepare: Callable[[torch.nn.Module], torch.nn.Module] | None = None):
        self.spec, self.placement, self.device = spec, placement, placement.device
        torch.set_num_threads(spec.train.cpus_per_worker)
        torch.manual_seed(spec.seed)
        self.data = self._data(data)
        train = spec.train
        self.autocast = autocast_for(train.precision, self.device, train.strategy)
        self.model = self._starting_model()
        self.objective = self._objective(self.model)  # before the model is wrapped or sharded
        self.ddp_model = self._placed(self.model, prepare)
        self.checkpoints = Checkpointer.for_run(train, spec.model)
        self.optimizer = make_optimizer(self.model, spec)
        self.forward = torch.compile(self.ddp_model) if spec.train.compile else self.ddp_model
        self.collate = WindowBatch(self.device, chat=spec.chat_template is not None,
                                   pairs=spec.pairs)
        # a pair is two rows of the block
        rows = 2 if spec.pairs else 1
        self.tokens_per_step = spec.train.batch_size * rows * self.model.config.block_size
        self.process = psutil.Process()
        self.process.cpu_percent(), psutil.cpu_percent()  # start the CPU load measurements

    def _data(self, data: dict) -> WorkerData:
        """This worker's windows of ``data`` (each split's chunks)."""
        return WorkerData(self.spec, data, self.placement.rank, self.placement.world_size)

    def _starting_model(self) -> torch.nn.Module:
        """The starting weights: loaded shard by shard under FSDP from a transformers directory
        (``sharded_start``: already sharded), else built or loaded whole."""
        if sharded_start.applies(self.spec):
            return sharded_start.sharded_model(self.spec, self.device)
        return starting_model(self.spec)

    def _objective(self, model: torch.nn.Module) -> LanguageModeling | Preference:
        """lm; or DPO against the starting weights: their log-probabilities precomputed (the
        table filled by ``precompute_reference``); with LoRA, ``model`` with its adapters off;
        else a frozen copy of it, taken before it is wrapped or sharded, and placed as it is."""
        spec = self.spec
        if not spec.pairs:
            return LanguageModeling()
        if spec.dpo.reference == "precomputed":
            stamp = starting_stamp(spec.model, spec.seed)
            return Preference(spec.dpo, PrecomputedReference(stamp))
        if uses_lora(spec.model):
            return Preference(spec.dpo, reference_of(model))
        if parallel.is_sharded(model):  # loaded shard by shard: so is the reference
            return Preference(spec.dpo, reference_of(model, frozen(self._starting_model())))
        copy_ = frozen_copy(model)
        if spec.train.strategy == "fsdp":
            copy_ = parallel.shard(copy_, self.device, spec.train.precision)
        return Preference(spec.dpo, reference_of(model, copy_.to(self.device)))

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

    @property
    def writes_checkpoints(self) -> bool:
        """Whether this worker writes (a part of) each checkpoint: rank 0, or every worker."""
        return self.checkpoints.writes(self.placement.rank)

    @property
    def precomputed(self) -> PrecomputedReference | None:
        """dpo.reference=precomputed: the table of the reference's log-probabilities."""
        reference = getattr(self.objective, "reference", None)
        return reference if isinstance(reference, PrecomputedReference) else None

    def load_checkpoint(self, directory: Path) -> TrainState:
        """Weights, optimizer and RNG from a training checkpoint (and the reference's
        log-probabilities a precomputed run's holds); the state it was taken at."""
        if self.precomputed is not None:
            self.precomputed.load(directory)
        return self.checkpoints.load(directory, self.model, self.optimizer)

    def save_checkpoint(self, directory: Path, state: TrainState) -> None:
        """A training checkpoint at ``state`` (this worker's part of it when sharded), stamped with
        the run's fingerprint, ``max_steps`` and number of workers; rank 0 adds the precomputed
        reference's log-probabilities."""
        spec = self.spec
        stamped = replace(state, fingerprint=spec.fingerprint, max_steps=spec.max_steps,
                          world=self.placement.world_size)
        if self.precomputed is not None and self.placement.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            self.precomputed.save(directory)  # before the checkpoint's seal, which lists it
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

    @torch.no_grad()
    def precompute_reference(self, state: TrainState) -> None:
        """dpo.reference=precomputed and no table yet (none in the checkpoint resumed): the
        starting weights' log-probabilities of every pair of both splits, each worker its
        contiguous share, in as many forwards on every worker (a sharded model's gather
        parameters), then gathered. At step 0 the policy still is the starting weights."""
        table = self.precomputed
        if table is None or table.table:
            return
        if state.step > 0:
            raise RunFailure(f"dpo.reference=precomputed: the checkpoint of step {state.step} "
                             "holds no reference log-probabilities; resume one this run wrote, "
                             "or start afresh")
        model = self.model
        model.eval()
        with self.autocast():
            ran = table.fill((self.collate(w) for w in self.data.every_window()),
                             lambda b: logps_of(model, b))
            even_forwards(model, ran, self.device, lambda idle: logps_of(model, idle))
        model.train()
        table.gather()

    def train_step(self, group: list[np.ndarray], lr: float, step: int = 0) -> StepResult:
        """Forward and backward over this worker's ``grad_accum`` micro-batches (the gradients are
        all-reduced, or reduce-scattered, after the last only), clip, and step the optimizer unless
        the gradient norm is not finite. ``step``: the optimizer step's number (the data knows
        it already)."""
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        loss_sum, hits, count, sums = 0.0, 0, 0, {}
        for i, windows in enumerate(group):
            last = i == len(group) - 1
            with contextlib.nullcontext() if last else parallel.gradients_accumulated(
                    self.ddp_model):
                scored = self.objective.score(self.forward, self.collate(windows),
                                              self.autocast)
                (scored.loss / self.spec.train.grad_accum).backward()
            loss_sum, hits = loss_sum + scored.loss.item(), hits + scored.hits
            count += scored.count
            sums = {k: sums.get(k, 0.0) + v for k, v in scored.sums.items()}
        return StepResult(loss_sum / len(group), hits, count, self.clipped_step(), sums)

    def clipped_step(self) -> float:
        """The gradients clipped to ``optim.grad_clip`` and the optimizer's step, unless their norm
        is not finite; that norm before clipping (the same on every rank)."""
        max_norm = self.spec.optim.grad_clip if self.spec.optim.grad_clip > 0 else math.inf
        grad_norm = parallel.as_float(
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        return grad_norm

    def metrics(self, interval: Interval, state: TrainState, lr: float) -> dict:
        """The metrics.csv row of an evaluation at ``state``: the interval's training figures and a
        validation pass, each summed over the workers, the most windows and chunks a worker read
        this epoch, and system load. Three collectives, in this order on every rank."""
        spec, world = self.spec, self.placement.world_size
        names = self.objective.figures
        train_loss, train_hits, train_count, *train_figures = all_reduce_sum(
            interval.loss, interval.hits, interval.count, *(interval.sums[k] for k in names))
        val = self._validation()
        windows_read, chunks_read = all_reduce_max(self.data.epoch_reads["windows"],
                                                   self.data.epoch_reads["chunks"])
        val_loss = val.pop("val_loss")
        per_pair = {f"train_{k}": v / max(train_count, 1) for k, v in zip(names, train_figures)}
        tokens_per_s = interval.tokens_per_s(self.tokens_per_step)
        flops_per_token = self.model.flops_per_token()
        return {
            "step": state.step,
            "epoch": state.epoch,
            "tokens": state.step * self.tokens_per_step,
            "lr": lr,
            "train_loss": train_loss / world / interval.steps,
            "val_loss": val_loss,
            **self._scales(val_loss),
            "train_acc": train_hits / max(train_count, 1),
            "val_acc": val.pop("val_acc"),
            "grad_norm": interval.grad_norm / interval.steps,
            "tokens_per_s": tokens_per_s,
            "step_time_s": interval.step_s / interval.steps,
            "mfu": (flops_per_token * tokens_per_s / (spec.train.peak_flops * world))
            if spec.train.peak_flops
            else None,
            **system_stats(self.process, self.device),
            "elapsed_s": state.elapsed_s,
            "workers": world,
            "windows_read": int(windows_read),  # this epoch, the most any worker read
            "chunks_read": int(chunks_read),
            **per_pair,  # dpo: rewards, their margin and the log-probabilities, per pair
            **val,  # dpo: the same on validation; a mixture: each source's val_loss_<name>
        }

    def _validation(self) -> dict:
        """A validation pass summed over the workers (one collective): ``val_loss``, ``val_acc``
        and the objective's figures per pair; for a mixture, each source's ``val_loss_<name>``,
        and loss and accuracy weighted by the sources' weights."""
        sets = self.data.val_by_source or {"": self.data.val}
        names, width = self.objective.figures, 3 + len(self.objective.figures)
        sums = all_reduce_sum(*(x for windows in sets.values() for x in validation_pass(
            self.model, windows, self.collate, self.autocast, self.objective)))
        out = {"val_loss": 0.0, "val_acc": 0.0}
        weights = self.spec.mixture.weights if self.spec.mixture else (1.0,)
        for i, (name, weight) in enumerate(zip(sets, weights)):
            loss_sum, hits, count, *figures = sums[i * width:(i + 1) * width]
            loss = loss_sum / max(count, 1)
            out["val_loss"] += weight * loss
            out["val_acc"] += weight * hits / max(count, 1)
            out |= {f"val_{k}": v / max(count, 1) for k, v in zip(names, figures)}
            if name:
                out[f"val_loss_{name}"] = loss
        return out

    def _scales(self, val_loss: float) -> dict:
        """Perplexity and bits per character of a language-modelling loss (none for DPO's)."""
        if self.spec.pairs:
            return {"val_ppl": None, "val_bpc": None}
        return {"val_ppl": math.exp(min(val_loss, 700)) if math.isfinite(val_loss) else val_loss,
                "val_bpc": bits_per_char(val_loss, self.spec.chars_per_token)}
