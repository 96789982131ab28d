"""The grpo group's schema (``grpo.*``): learning from rewards (GRPO, issue 52) — how many answers
a prompt gets and how they are drawn, the user's reward functions, the loss. Apart from the rest of
the configuration (core/config.py), as the sweep group is.

The loss types are TRL's (``GRPOTrainer``, read at trl f2cd577): training/objectives/grpo_loss.py
computes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from raydp_llm.core.schema import (
    COUNT,
    POSITIVE,
    Check,
    Choice,
    at_least,
    one_of,
    optional,
    setting,
)


class GrpoLossType(Choice):
    grpo = "grpo", "the paper's: each answer's mean over its tokens, then the mean over answers"
    dr_grpo = "dr_grpo", ("Dr. GRPO's: the tokens' sum over answers × grpo.max_new_tokens (no "
                          "length bias)")
    dapo = "dapo", "DAPO's: the mean over every answer token of the batch"


class RewardScale(Choice):
    group = "group", "advantages divided by the standard deviation of the prompt's group"
    batch = "batch", "by the standard deviation of the whole batch"
    none = "none", "not divided (Dr. GRPO)"


@dataclass(frozen=True)
class GrpoSettings:
    num_generations: int = setting(8, "answers sampled per prompt (the group its advantages are "
                                      "relative to)",
                                   check=Check(lambda v: v >= 2, "a whole number ≥ 2"))
    max_new_tokens: int = setting(64, "the most tokens an answer has", check=COUNT)
    temperature: float = setting(1.0, "the sampling temperature of the answers", check=POSITIVE)
    top_p: float = setting(1.0, "nucleus sampling: the smallest set of tokens whose "
                                "probability reaches this; 1 = all",
                           check=Check(lambda v: 0 < v <= 1, "a number in (0, 1]"))
    rewards: List[str] = setting([], "the reward functions: 'path/to/file.py:function' or "
                                     "'package.module:function', called as "
                                     "function(prompts, completions, **columns) -> "
                                     "list[float | None]")
    reward_weights: Optional[List[float]] = setting(None, "each reward's weight in the sum; "
                                                          "null = 1 each")
    reward_timeout_s: float = setting(30.0, "seconds a reward function has for one batch; then "
                                            "its batch scores None (a reward failure)",
                                      check=POSITIVE)
    max_reward_failures: int = setting(3, "steps in a row a reward function may fail on every "
                                          "batch before the run stops", check=COUNT)
    scale_rewards: str = setting(RewardScale.group, RewardScale.listed(),
                                 check=one_of(RewardScale))
    loss_type: str = setting(GrpoLossType.dapo, GrpoLossType.listed(),
                             check=one_of(GrpoLossType))
    epsilon: float = setting(0.2, "the clip's lower bound: ratios below 1 - epsilon are clipped",
                             check=POSITIVE)
    epsilon_high: Optional[float] = setting(None, "the clip's upper bound (DAPO's clip-higher): "
                                                  "ratios above 1 + epsilon_high; null = epsilon",
                                            check=optional(POSITIVE))
    num_iterations: int = setting(1, "updates per batch of answers (μ)", check=COUNT)
    generation_batch_size: int = setting(256, "answers (prompts × num_generations) a worker "
                                              "draws at once (a KV cache each); fewer hold "
                                              "less memory", check=COUNT)
    update_batch_size: Optional[int] = setting(None, "answers a worker takes the "
                                                     "log-probabilities of and backpropagates "
                                                     "at once (the update's micro-batch; a "
                                                     "group may be split); null = "
                                                     "generation_batch_size",
                                               check=optional(COUNT))
    disable_dropout: bool = setting(True, "dropout off in the policy's forwards, as TRL's "
                                          "disable_dropout; false keeps the model's")
    beta: float = setting(0.0, "the weight of the KL divergence to the reference (k3 estimator); "
                               "0 = no reference model", check=at_least(0))
