"""What a worker minimises (``train.objective``), batch by batch, in the step and in validation:
next-token cross-entropy (``LanguageModeling``), or DPO on preference pairs (``Preference``), whose
reference is the starting weights, frozen (``reference_of``).

Both give a ``Scored``: the loss the step runs backward on, its hits out of its count (lm: targets
predicted right out of those counted; dpo: pairs whose chosen answer has the higher reward out of
the pairs) and, for DPO, the sums the metrics average per pair.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from raydp_llm.core.config import DpoSettings
from raydp_llm.data.batches import Batch
from raydp_llm.training.dpo import DpoLoss, PairLogps, dpo_loss
from raydp_llm.training.metrics import DPO_FIGURES


@dataclass
class Scored:
    loss: torch.Tensor  # the batch's mean loss, with the gradient
    hits: int  # lm: counted targets predicted right (top-1); dpo: pairs ranked right
    count: int  # lm: counted targets; dpo: pairs
    sums: dict[str, float] = field(default_factory=dict)  # dpo: DpoLoss.sums()


class LanguageModeling:
    """``train.objective=lm``: the mean cross-entropy of the targets the batch counts."""

    figures: tuple[str, ...] = ()

    def score(self, forward: nn.Module, batch: Batch, autocast: Callable) -> Scored:
        with autocast():
            logits, loss = forward(batch.inputs, **batch.model_args())
        counted = batch.counted
        hits = int(((logits.argmax(dim=-1) == batch.targets) & counted).sum())
        return Scored(loss, hits, int(counted.sum()))


class Preference:
    """``train.objective=dpo``: the DPO loss of a batch of pairs (``data/batches.py``: the chosen
    answers' rows, then the rejected answers' rows) against ``reference``, a function of the batch
    that gives the frozen starting weights' log-probabilities of its answers (``reference_of``,
    or ``precomputed.PrecomputedReference``)."""

    figures = DPO_FIGURES

    def __init__(self, dpo: DpoSettings, reference: Callable[[Batch], PairLogps]):
        self.dpo, self.reference = dpo, reference

    def score(self, forward: nn.Module, batch: Batch, autocast: Callable) -> Scored:
        with autocast():
            logits, _ = forward(batch.inputs, positions=batch.positions)
        policy = PairLogps.of(logits, batch.targets)
        with torch.no_grad(), autocast():
            reference = self.reference(batch)
        out: DpoLoss = dpo_loss(policy, reference, self.dpo.beta, self.dpo.loss,
                                self.dpo.label_smoothing)
        sums = out.sums()
        return Scored(out.loss, int(sums["reward_accuracy"]), int(sums["pairs"]), sums)


def without_dropout(model: nn.Module) -> nn.Module:
    """Every dropout of ``model`` off (as TRL's DPO does): the policy at its first step is then
    exactly the reference, and the rewards measure the weights, not the dropout masks. Dropout
    modules, and the rates attention layers keep as numbers (the GPT's ``dropout``, transformers'
    ``attention_dropout``)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name in ("dropout", "attention_dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    return model


def frozen_copy(model: nn.Module) -> nn.Module:
    """The starting weights as a second model that never trains: taken before the policy is
    wrapped or sharded, in eval mode, without gradients."""
    return frozen(copy.deepcopy(model))


def frozen(model: nn.Module) -> nn.Module:
    """``model`` in eval mode, without gradients: a reference that never trains."""
    model.eval().requires_grad_(False)
    return model


def reference_of(model: nn.Module, copy_: nn.Module | None = None
                 ) -> Callable[[Batch], PairLogps]:
    """The reference's log-probabilities of a batch's answers: by ``copy_`` (``frozen_copy``,
    placed like the policy); without one, by ``model`` itself with its LoRA adapters switched off
    (no second copy in memory)."""

    def adapters_off(batch: Batch) -> PairLogps:
        with model.net.disable_adapter(), evaluating(model):
            return logps_of(model, batch)

    def copied(batch: Batch) -> PairLogps:
        return logps_of(copy_, batch)

    return adapters_off if copy_ is None else copied


def logps_of(model: nn.Module, batch: Batch) -> PairLogps:
    """``model``'s log-probabilities of the answers of a batch of pairs."""
    return PairLogps.of(model(batch.inputs, positions=batch.positions)[0], batch.targets)


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """``model`` in eval mode within the block; its mode before, after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)
