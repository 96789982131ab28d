"""``train.best_by``: which checkpoint is the best, by a ``metrics.csv`` column (a validation
figure, a mixture source's loss, a task score of ``train.eval_tasks``). Ray Train ranks the
checkpoints by it as they are reported (``checkpoint_config``) and keeps the best beside the
latest; after the fit, ``best_of`` names it, and the run exports it to ``best_model/``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ray.train import Checkpoint, CheckpointConfig

from raydp_llm.core.errors import InputError
from raydp_llm.training.driver.metrics import COLUMNS, SOURCE_LOSS, TASK

# a column whose name ends so is better lower; every other one (accuracies, task scores, rewards)
# is better higher
LOWER_IS_BETTER = ("loss", "ppl", "bpc", "perplexity", "bits_per_byte")
# what an evaluation reports beside the figures: never a ranking
NOT_FIGURES = ("step", "epoch", "tokens", "lr", "elapsed_s", "workers")


def order(column: str) -> str:
    """``min`` for a loss (a source's too), a perplexity or bits; ``max`` for any other
    column."""
    lower = column.endswith(LOWER_IS_BETTER) or column.startswith(SOURCE_LOSS)
    return "min" if lower else "max"


def check(best_by: str | None, tasks: list[str], sources: list[str],
          task_interval: int | None, setting: str = "train.best_by") -> None:
    """A ``train.best_by`` (or another ``setting`` that names a column) that every checkpoint
    will report: one line naming what to give."""
    if best_by is None:
        return
    known = [c for c in COLUMNS if c not in NOT_FIGURES]
    known += [f"{SOURCE_LOSS}{name}" for name in sources]
    task = next((t for t in tasks if best_by.startswith(f"{TASK}{t}_")), None)
    if best_by not in known and task is None:
        scored = ", ".join(f"{TASK}{t}_<metric>" for t in tasks) or "train.eval_tasks has none"
        raise InputError(f"{setting}={best_by}: not a column every checkpoint reports; give "
                         f"val_loss, val_acc or another of metrics.csv's figures, a source's "
                         f"val_loss_<name>, or a task score ({scored})")
    if task is not None and task_interval is not None:
        raise InputError(f"{setting}={best_by}: tasks are scored every "
                         f"train.task_interval={task_interval} steps, not at every checkpoint; "
                         "set train.task_interval=null to rank the checkpoints by a task")


def checkpoint_config(keep: int, best_by: str | None) -> CheckpointConfig:
    """The ``keep`` latest checkpoints; with ``best_by``, the ``keep`` best by it (Ray Train keeps
    the latest as well, for a resume)."""
    if best_by is None:
        return CheckpointConfig(num_to_keep=keep)
    return CheckpointConfig(num_to_keep=keep, checkpoint_score_attribute=best_by,
                            checkpoint_score_order=order(best_by))


@dataclass(frozen=True)
class Best:
    """The best checkpoint by ``by``: its step, its value of ``by``, and the checkpoint."""

    by: str
    step: int
    value: float
    checkpoint: Checkpoint

    def summary(self, exported_to: str) -> dict:
        """``summary.json``'s ``best_checkpoint``."""
        return {"by": self.by, "order": order(self.by), "step": self.step,
                "value": self.value, "checkpoint": self.checkpoint.path, "model": exported_to}


def best_of(reported: list[tuple[Checkpoint, dict]] | None, by: str | None) -> Best | None:
    """The best of the checkpoints Ray Train kept (``Result.best_checkpoints``) by ``by``; of
    equals, the later, as Ray Train ranks them (it may have deleted the earlier). None without
    ``by`` or a checkpoint with a finite value of it."""
    ranked = [Best(by, metrics["step"], metrics[by], checkpoint)
              for checkpoint, metrics in reported or []
              if by and isinstance(metrics.get(by), (int, float)) and math.isfinite(metrics[by])]
    if not ranked:
        return None
    sign = 1 if order(by) == "min" else -1
    return min(ranked, key=lambda best: (sign * best.value, -best.step))
