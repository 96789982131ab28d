"""The sweep group's schema (``sweep.*``): how a multirun (``-m``) runs its jobs as Ray Tune
trials with ``hydra/launcher=ray`` (raydp_llm/cli/sweep/), how many at once, which it stops early,
how many Optuna proposes. Apart from the rest of the configuration (core/config.py, which
re-exports it), as the data and model groups are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raydp_llm.core.schema import COUNT, OPTIONAL_COUNT, Check, Choice, one_of, optional, setting


class SweepScheduler(Choice):
    none = "none", "every trial runs to its last step"
    asha = "asha", ("Ray Tune's ASHAScheduler: at each rung (sweep.grace_steps × "
                    "sweep.reduction_factor^k steps) the trials below the top "
                    "1/sweep.reduction_factor stop")


class SweepMode(Choice):
    min = "min"
    max = "max"


@dataclass(frozen=True)
class SweepSettings:
    max_concurrent: Optional[int] = setting(None, "trials at once (hydra/launcher=ray): at most "
                                                  "this many; null = as many as the cluster "
                                                  "holds", check=OPTIONAL_COUNT)
    scheduler: str = setting(SweepScheduler.none, SweepScheduler.listed(),
                             check=one_of(SweepScheduler))
    metric: str = setting("val_loss", "the metrics.csv column that ranks the trials "
                                      "(sweep.scheduler, hydra/sweeper=optuna): a validation "
                                      "figure, val_loss_<source> or task_<task>_<metric>")
    mode: Optional[str] = setting(None, "min | max: which end of sweep.metric is better; null = "
                                        "min for losses, perplexities and bits, else max",
                                  check=optional(one_of(SweepMode)))
    grace_steps: int = setting(100, "ASHA: steps every trial trains before it may be stopped",
                               check=COUNT)
    reduction_factor: int = setting(3, "ASHA: 1 in this many trials goes on at each rung",
                                    check=Check(lambda v: v >= 2, "a whole number ≥ 2"))
    trials: int = setting(8, "hydra/sweeper=optuna: trials proposed in all", check=COUNT)
