"""``train.objective=lm``: next-token cross-entropy, on a worker's windows (windows.py).

A step is ``train.grad_accum`` micro-batches forward and backward (the gradients all-reduced after
the last only), then the optimizer's update. An evaluation adds the interval's training loss and a
validation pass over this worker's share of the held-out windows, both summed over the workers;
a mixture's validation loss per source too. DPO (dpo.py) is this objective with another loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.data.batches import Batch, WindowBatch
from raydp_llm.models.base import IGNORE
from raydp_llm.training.objectives import (
    Interval,
    Objective,
    StepResult,
    Trainee,
    all_reduce_max,
    all_reduce_sum,
)
from raydp_llm.training.objectives.windows import ValWindows, WorkerData


@dataclass
class Scored:
    """A batch's loss and what it got right."""

    loss: torch.Tensor  # the batch's mean loss, with the gradient
    hits: int  # lm: counted targets predicted right (top-1); dpo: pairs ranked right
    count: int  # lm: counted targets; dpo: pairs
    sums: dict[str, float] = field(default_factory=dict)  # dpo: DpoLoss.sums()


def bits_per_char(loss: float, chars_per_token: float | None) -> float | None:
    """Bits per character of a mean loss per token in nats (metrics.csv's ``val_bpc``): ``loss /
    ln 2 / characters per token``; None for a corpus of token ids, which has no characters."""
    return loss / math.log(2) / chars_per_token if chars_per_token else None


def idle_batch(block_size: int, device: torch.device) -> Batch:
    """A batch of one pair of rows whose targets all are ``IGNORE``: a forward that counts
    nothing (a sharded model's workers run as many forwards each)."""
    inputs = torch.zeros((2, block_size), dtype=torch.long, device=device)
    return Batch(inputs, torch.full_like(inputs, IGNORE), None)


def even_forwards(trainee: Trainee, mine: int, forward: Callable[[Batch], object]) -> None:
    """A sharded model's forwards gather its parameters on every worker, so each runs as many:
    this worker, having run ``mine``, runs ``forward`` on idle batches (counting nothing) up to
    the most any worker ran. Nothing for a model that is not sharded."""
    if not trainee.sharded:
        return
    idle = idle_batch(trainee.model.config.block_size, trainee.device)
    for _ in range(int(all_reduce_max(mine)[0]) - mine):
        forward(idle)


class LanguageModeling(Objective):
    """The mean cross-entropy of the targets a batch counts (a chat's answers only, with
    ``data.chat``), on this worker's windows."""

    figures: tuple[str, ...] = ()  # the objective's own sums a batch reports (dpo's)

    def __init__(self, trainee: Trainee, data: dict):
        spec, placement = trainee.spec, trainee.placement
        self.trainee, self.spec = trainee, spec
        self.data = WorkerData(spec, data, placement.rank, placement.world_size)
        self.collate = WindowBatch(trainee.device, chat=spec.chat_template is not None,
                                   pairs=spec.pairs)
        rows = 2 if spec.pairs else 1  # a pair is two rows of the block
        self.tokens_per_step = spec.train.batch_size * rows * trainee.model.config.block_size

    def score(self, forward: nn.Module, batch: Batch) -> Scored:
        with self.trainee.autocast():
            _, scores = forward(batch.inputs, **batch.model_args())
        return Scored(scores.mean, int(scores.hits.sum()), int(scores.counted.sum()))

    def counted(self, batch: Batch) -> int:
        """What a batch's mean loss is over: its counted targets (dpo: its pairs)."""
        return int(batch.counted.sum())

    def step(self, group: list[np.ndarray], step: int) -> StepResult:
        """Forward and backward over this worker's ``grad_accum`` micro-batches, then the update.
        The loss is the mean over every counted target of the step, all workers' and all
        micro-batches' (one collective counts them): a micro-batch's share is its mean weighted
        by its part of that count, so unequal shares (a chat's trained tokens) weigh as in one
        process."""
        trainee = self.trainee
        batches = [self.collate(windows) for windows in group]
        counts = [self.counted(b) for b in batches]
        whole = max(all_reduce_sum(sum(counts))[0], 1)
        loss_sum, hits, sums = 0.0, 0, {}
        for i, (batch, count) in enumerate(zip(batches, counts)):
            with trainee.accumulating(last=i == len(group) - 1):
                scored = self.score(trainee.forward, batch)
                trainee.backward(scored.loss * (count / whole))
            loss_sum, hits = loss_sum + scored.loss.item() * count, hits + scored.hits
            sums = {k: sums.get(k, 0.0) + v for k, v in scored.sums.items()}
        mine = sum(counts)
        return StepResult(loss_sum / max(mine, 1), hits, mine, trainee.update(), sums)

    def columns(self, interval: Interval, state: TrainState) -> dict:
        """The interval's training figures and a validation pass, each summed over the workers,
        and the most windows and chunks a worker read this epoch: three collectives."""
        spec, world = self.spec, self.trainee.placement.world_size
        names = self.figures
        train_loss, train_hits, train_count, *train_figures = all_reduce_sum(
            interval.loss, interval.hits, interval.count, *(interval.sums[k] for k in names))
        val = self._validation()
        windows_read, chunks_read = all_reduce_max(self.data.epoch_reads["windows"],
                                                   self.data.epoch_reads["chunks"])
        tokens_per_s = interval.tokens_per_s(self.tokens_per_step)
        flops = self.trainee.model.flops_per_token() * tokens_per_s
        return {
            "tokens": state.step * self.tokens_per_step,
            "train_loss": train_loss / world / interval.steps,
            **self._scales(val["val_loss"]),
            "train_acc": train_hits / max(train_count, 1),
            "tokens_per_s": tokens_per_s,
            "mfu": flops / (spec.train.peak_flops * world) if spec.train.peak_flops else None,
            "windows_read": int(windows_read),  # this epoch, the most any worker read
            "chunks_read": int(chunks_read),
            # dpo: rewards, their margin and the log-probabilities, per pair
            **{f"train_{k}": v / max(train_count, 1) for k, v in zip(names, train_figures)},
            **val,  # val_loss, val_acc; dpo's figures; a mixture: each source's val_loss_<name>
        }

    @torch.no_grad()
    def validation_pass(self, windows: WorkerData | ValWindows) -> list[float]:
        """Over this worker's share of ``windows``' validation windows: the summed loss, the hits
        and what they count (lm: nats, top-1 predictions right, predicted tokens; dpo: per pair,
        pairs ranked right, pairs), then the sums of the objective's ``figures``."""
        model = self.trainee.model
        model.eval()
        loss_sum = hits = count = 0
        figures = dict.fromkeys(self.figures, 0.0)
        for batch in windows.val_batches():
            scored = self.score(model, self.collate(batch))
            loss_sum += scored.loss.item() * scored.count
            hits, count = hits + scored.hits, count + scored.count
            figures = {k: v + scored.sums[k] for k, v in figures.items()}
        even_forwards(self.trainee, windows.val_batch_count(),
                      lambda idle: self.score(model, idle))
        model.train()
        return [loss_sum, hits, count, *figures.values()]

    def _validation(self) -> dict:
        """A validation pass summed over the workers (one collective): ``val_loss``, ``val_acc``
        and the objective's figures per pair; for a mixture, each source's ``val_loss_<name>``,
        and loss and accuracy weighted by the sources' weights."""
        sets = self.data.val_by_source or {"": self.data.val}
        names, width = self.figures, 3 + len(self.figures)
        sums = all_reduce_sum(*(x for windows in sets.values()
                                for x in self.validation_pass(windows)))
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
