"""What a worker learns by (``train.objective``): each objective a module, behind the one interface
the worker calls (``Objective``):

    lm.py    ``LanguageModeling``: next-token cross-entropy of windows of text
    dpo.py   ``Preference``: DPO on windows of preference pairs, against the starting weights
    grpo.py  ``Grpo``: answers the model draws to prompts, scored by the user's rewards

The worker (worker/worker.py) picks one by ``train.objective`` and owns what every objective
trains with: the model, placed and wrapped, the optimizer, the device, the checkpoints, and the
reference model an objective asks for, and lends them as a ``Trainee``. An objective owns its
share of the data (``data``), its optimizer step (``step``) and its columns of an evaluation's
metrics row (``columns``).

Their helpers sit beside them: the losses' arithmetic (dpo_loss.py, grpo_loss.py), the reference
(reference.py, precomputed.py), GRPO's answers and rewards (rollout.py, rewards.py) and a worker's
windows (windows.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.core.timing import Stopwatch
from raydp_llm.training.spec import TrainSpec


@dataclass(frozen=True)
class Placement:
    """Where a worker runs: its rank among ``world_size`` workers, its rank on its node, its
    device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


@dataclass
class StepResult:
    """One optimizer step on one worker."""

    loss: float  # this worker's mean loss over its micro-batches (grpo: its share of the step's)
    hits: int  # lm: correct top-1 predictions; dpo: pairs ranked right
    count: int  # what the hits count (lm: predicted tokens; dpo: pairs; grpo: answer tokens)
    grad_norm: float  # total gradient norm before clipping: the same on every rank
    sums: dict[str, float] = field(default_factory=dict)  # the objective's figures, summed
    # what the live bar shows beside the loss (grpo: the step's reward over every worker)
    live: dict[str, float] = field(default_factory=dict)


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

    def tokens_per_s(self, tokens_per_step: float) -> float:
        return self.steps * tokens_per_step / self.clock.seconds()


def all_reduce_sum(*values: float) -> list[float]:
    """``values`` summed over the workers (as they are with one process)."""
    return _all_reduced(values, dist.ReduceOp.SUM)


def all_reduce_max(*values: float) -> list[float]:
    """The largest of each of ``values`` over the workers."""
    return _all_reduced(values, dist.ReduceOp.MAX)


def every_worker_done(done: bool) -> bool:
    """Whether every worker is ``done`` (one collective)."""
    return all_reduce_sum(0.0 if done else 1.0)[0] == 0


def _all_reduced(values, op) -> list[float]:
    """``values`` reduced over the workers, on the device the process group reduces on: a GPU
    for nccl, which reduces no CPU tensor; the CPU for gloo."""
    t = torch.tensor(values, dtype=torch.float64)
    if not dist.is_initialized():
        return t.tolist()
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=op)
    return t.tolist()


class Trainee(Protocol):
    """What an objective trains with: the worker (``worker.Worker``)."""

    spec: TrainSpec
    placement: Placement
    device: torch.device
    model: nn.Module  # unwrapped: evaluations, answers, LoRA's adapters switched off
    forward: nn.Module  # the model as the step runs it: wrapped for DDP or sharded, compiled
    reference: nn.Module | None  # the frozen starting weights ``Objective.wants_reference`` asks
    sharded: bool  # the model's parameters are sharded over the workers (FSDP2)
    autocast: Callable[[], AbstractContextManager]  # bf16 where the run asks for it

    def accumulating(self, last: bool) -> AbstractContextManager:
        """A backward within: its gradients stay on this worker unless ``last`` (the step's last
        backward, whose gradients are all-reduced or reduce-scattered over the workers)."""

    def backward(self, share: torch.Tensor) -> None:
        """The gradients of ``share``, this worker's part of the whole step's loss (the workers'
        parts sum to it), added to the model's: reduced over the workers (after the last
        ``accumulating`` backward) to the gradient one process computes of the whole loss."""

    def update(self) -> float:
        """The gradients clipped and the optimizer's step (unless their norm is not finite); that
        norm before clipping, the same on every rank."""

    def clear_gradients(self) -> None:
        """Every gradient dropped (before another update on the same step's data)."""


class Share(Protocol):
    """An objective's share of the data on one worker."""

    epoch_reads: dict  # this epoch's reads so far: {"epoch", "windows", "chunks"}

    def steps(self, epoch: int, first_step: int) -> Iterator[list]:
        """What each optimizer step ``first_step..`` of ``epoch`` takes, step by step."""


class Objective:
    """What the worker calls: ``start`` once before the first step, ``step`` each optimizer
    step, ``columns`` at each evaluation (on every rank: its collectives in the same order),
    ``save`` and ``load`` with each checkpoint. Made as ``kind(trainee, data)`` once the
    worker's model is placed, with this worker's part of the run's data. An objective that
    needs no reference, nothing before its first step and nothing in a checkpoint of its own
    defines ``step`` and ``columns`` alone."""

    data: Share
    tokens_per_step: float  # for the live tokens/s

    @staticmethod
    def wants_reference(spec: TrainSpec) -> bool:
        """Whether the worker builds ``Trainee.reference`` for it."""
        return False

    def start(self, state: TrainState) -> None:
        """What it makes before the first step: nothing."""

    def step(self, group: list, step: int) -> StepResult:
        raise NotImplementedError

    def columns(self, interval: Interval, state: TrainState) -> dict:
        raise NotImplementedError

    def save(self, directory: Path, rank: int) -> None:
        """What it keeps in a checkpoint beside the worker's: nothing."""

    def load(self, directory: Path) -> None:
        """What it keeps in a checkpoint beside the worker's: nothing."""
