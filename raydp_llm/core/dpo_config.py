"""The dpo group's schema (``dpo.*``): preference tuning (``train.objective=dpo``), its loss and its
reference. Apart from the rest of the configuration (core/config.py, which re-exports it), as the
grpo and sweep groups are."""

from __future__ import annotations

from dataclasses import dataclass

from raydp_llm.core.schema import POSITIVE, Check, Choice, one_of, setting


class DpoLossKind(Choice):
    sigmoid = "sigmoid", "the paper's -log σ(β·h), with dpo.label_smoothing (cDPO)"
    ipo = "ipo", "IPO's (h - 1/(2β))², on log-probabilities per answer token"


class DpoReference(Choice):
    model = "model", ("the starting weights, frozen: with LoRA the base with the adapters off (no "
                      "second copy), else a frozen copy sharded like the policy")
    precomputed = "precomputed", ("the starting weights' log-probabilities of every pair, "
                                  "computed by the workers before the first step and kept in "
                                  "each checkpoint: no reference model in memory while training")


@dataclass(frozen=True)
class DpoSettings:
    """Preference tuning (``train.objective=dpo``): the loss, and the reference the policy's
    rewards are measured against (training/objectives/dpo_loss.py)."""

    beta: float = setting(0.1, "β: the weight of the policy's divergence from the reference; "
                               "smaller lets it move further", check=POSITIVE)
    loss: str = setting(DpoLossKind.sigmoid, DpoLossKind.listed(), check=one_of(DpoLossKind))
    label_smoothing: float = setting(0.0, "sigmoid: the share of pairs taken to be mislabelled "
                                          "(cDPO), in [0, 0.5)",
                                     check=Check(lambda v: 0 <= v < 0.5, "a number in [0, 0.5)"))
    reference: str = setting(DpoReference.model, DpoReference.listed(),
                             check=one_of(DpoReference))
    disable_dropout: bool = setting(True, "dropout off in the policy's forwards, as TRL's "
                                          "disable_dropout; false keeps the model's")


# the per-pair figures a DPO run reports (metrics.csv's train_* and val_* each, DpoLoss.sums)
DPO_FIGURES = ("reward_margin", "chosen_reward", "rejected_reward", "chosen_logp", "rejected_logp")
