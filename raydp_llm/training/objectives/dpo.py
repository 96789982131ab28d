"""``train.objective=dpo``: the DPO loss (dpo_loss.py) of windows of preference pairs (the chosen
answers' rows, then the rejected answers', data/batches.py) against the starting weights' figures:
the worker's reference model (the model with LoRA's adapters off, or a frozen copy), or with
``dpo.reference=precomputed`` a table of them computed before the first step (precomputed.py).
Steps and evaluations are language modelling's (lm.py), with this loss and its figures.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.core.dpo_config import DPO_FIGURES
from raydp_llm.core.errors import RunFailure
from raydp_llm.data.batches import Batch
from raydp_llm.training.objectives import Trainee
from raydp_llm.training.objectives.dpo_loss import DpoLoss, PairLogps, dpo_loss
from raydp_llm.training.objectives.lm import LanguageModeling, Scored, even_forwards
from raydp_llm.training.objectives.precomputed import PrecomputedReference, starting_stamp
from raydp_llm.training.objectives.reference import reference_weights
from raydp_llm.training.spec import TrainSpec


def logps_of(model: nn.Module, batch: Batch) -> PairLogps:
    """``model``'s log-probabilities of the answers of a batch of pairs."""
    _, scores = model(batch.inputs, batch.targets, positions=batch.positions)
    return PairLogps.of(scores)


def reference_of(model: nn.Module, reference: nn.Module) -> Callable[[Batch], PairLogps]:
    """The reference's log-probabilities of a batch's answers: by ``reference`` (a frozen copy,
    placed like the policy), or by ``model`` itself with its LoRA adapters off when the reference
    is ``model`` (no second copy in memory)."""

    def logps(batch: Batch) -> PairLogps:
        with reference_weights(model, reference) as weights:
            return logps_of(weights, batch)

    return logps


class Preference(LanguageModeling):
    """The DPO loss of a batch of pairs against ``reference``, a function of the batch that
    gives the starting weights' log-probabilities of its answers."""

    figures = DPO_FIGURES

    def __init__(self, trainee: Trainee, data: dict):
        super().__init__(trainee, data)
        self.dpo = trainee.spec.dpo
        self.precomputed: PrecomputedReference | None = None
        if self.dpo.reference == "precomputed":
            self.precomputed = PrecomputedReference(starting_stamp(self.spec.model,
                                                                   self.spec.seed))
            self.reference = self.precomputed
        else:
            self.reference = reference_of(trainee.model, trainee.reference)

    @staticmethod
    def wants_reference(spec: TrainSpec) -> bool:
        return spec.dpo.reference != "precomputed"

    def counted(self, batch: Batch) -> int:
        """A batch's pairs: its chosen rows, then its rejected rows."""
        return batch.inputs.size(0) // 2

    def score(self, forward: nn.Module, batch: Batch) -> Scored:
        with self.trainee.autocast():
            policy = logps_of(forward, batch)
        with torch.no_grad(), self.trainee.autocast():
            reference = self.reference(batch)
        out: DpoLoss = dpo_loss(policy, reference, self.dpo.beta, self.dpo.loss,
                                self.dpo.label_smoothing)
        sums = out.sums()
        return Scored(out.loss, int(sums["reward_accuracy"]), int(sums["pairs"]), sums)

    @torch.no_grad()
    def start(self, state: TrainState) -> None:
        """dpo.reference=precomputed and no table yet (none in the checkpoint resumed): the
        starting weights' log-probabilities of every pair of both splits, each worker its
        contiguous share, in as many forwards on every worker (a sharded model's gather
        parameters), then gathered. At step 0 the policy still is the starting weights."""
        table, trainee = self.precomputed, self.trainee
        if table is None or table.table:
            return
        if state.step > 0:
            raise RunFailure(f"dpo.reference=precomputed: the checkpoint of step {state.step} "
                             "holds no reference log-probabilities; resume one this run wrote, "
                             "or start afresh")
        model = trainee.model
        model.eval()
        with trainee.autocast():
            ran = table.fill((self.collate(w) for w in self.data.every_window()),
                             lambda b: logps_of(model, b))
            even_forwards(trainee, ran, lambda idle: logps_of(model, idle))
        model.train()
        table.gather()

    def save(self, directory: Path, rank: int) -> None:
        """Rank 0: the precomputed reference's log-probabilities, before the checkpoint's seal
        (which lists them)."""
        if self.precomputed is not None and rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            self.precomputed.save(directory)

    def load(self, directory: Path) -> None:
        """The precomputed reference's log-probabilities a checkpoint holds."""
        if self.precomputed is not None:
            self.precomputed.load(directory)
