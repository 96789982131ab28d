"""Direct preference optimisation (DPO, Rafailov et al. 2023): the loss of a batch of preference
pairs from the policy's and the reference model's log-probabilities of each answer, and what it
reports (rewards, their margin, the share of pairs ranked right).

A pair is a prompt and two answers, the chosen and the rejected. The model reads each answer after
its prompt; an answer's log-probability is the sum over its own tokens (the targets the batch
counts, not ``IGNORE``: the prompt's and the padding's are). A batch holds the P chosen answers
in its first P rows and the P rejected ones, in the same order, in the next P.

Shapes: P pairs, N = 2P rows, T time, V vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from raydp_llm.core.config import DpoLossKind
from raydp_llm.models.base import TokenScores


def answer_logps(scores: TokenScores) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed log-probability of the targets it counts (N,), and how many it counts
    (N,), from the model's ``scores`` of a batch's targets (N, T): minus their cross-entropy."""
    return -scores.nats.sum(dim=1), scores.counted.sum(dim=1)


@dataclass(frozen=True)
class PairLogps:
    """One model's log-probabilities of the chosen and of the rejected answers (P,) each, and the
    tokens each counts."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor

    @classmethod
    def of(cls, scores: TokenScores) -> PairLogps:
        """From the scores of a batch of pairs: the chosen answers in the first half of the
        rows, the rejected in the second."""
        logps, tokens = answer_logps(scores)
        P = logps.size(0) // 2
        return cls(logps[:P], logps[P:], tokens[:P], tokens[P:])

    def per_token(self) -> PairLogps:
        """The mean log-probability per answer token instead of the sum (IPO's length norm)."""
        return PairLogps(self.chosen / self.chosen_tokens.clamp(min=1),
                         self.rejected / self.rejected_tokens.clamp(min=1),
                         self.chosen_tokens, self.rejected_tokens)

    def detached(self) -> PairLogps:
        return PairLogps(self.chosen.detach(), self.rejected.detach(), self.chosen_tokens,
                         self.rejected_tokens)


@dataclass(frozen=True)
class DpoLoss:
    """The loss of a batch (the mean over its pairs) and each pair's implicit rewards:
    beta × (the policy's log-probability − the reference's) of each answer."""

    loss: torch.Tensor  # () with the policy's gradient
    losses: torch.Tensor  # (P,)
    chosen_reward: torch.Tensor  # (P,) detached
    rejected_reward: torch.Tensor  # (P,) detached
    policy: PairLogps  # detached

    def sums(self) -> dict[str, float]:
        """The batch's sums over its pairs (``pairs`` among them): metrics add across batches and
        workers before they are divided by the pairs (``means``)."""
        margin = self.chosen_reward - self.rejected_reward
        return {
            "pairs": float(self.losses.numel()),
            "loss": float(self.losses.detach().sum()),
            "reward_accuracy": float((margin > 0).float().sum()),
            "reward_margin": float(margin.sum()),
            "chosen_reward": float(self.chosen_reward.sum()),
            "rejected_reward": float(self.rejected_reward.sum()),
            "chosen_logp": float(self.policy.chosen.sum()),
            "rejected_logp": float(self.policy.rejected.sum()),
        }


def means(sums: dict[str, float]) -> dict[str, float]:
    """Metrics summed over batches (``DpoLoss.sums``) as means per pair."""
    pairs = max(sums["pairs"], 1.0)
    return {k: v / pairs for k, v in sums.items() if k != "pairs"}


def dpo_loss(policy: PairLogps, reference: PairLogps, beta: float, kind: str = "sigmoid",
             label_smoothing: float = 0.0) -> DpoLoss:
    """The DPO loss of ``policy`` against the frozen ``reference`` (the same pairs): with h the
    difference of the two models' log-ratios of chosen over rejected,
    sigmoid: −(1−ε)·log σ(βh) − ε·log σ(−βh) (ε = ``label_smoothing``, cDPO);
    ipo: (h − 1/(2β))², on log-probabilities per answer token."""
    if kind not in DpoLossKind.values():  # the paper's, or IPO's (Azar et al. 2023, eq. 17)
        raise ValueError(f"dpo.loss={kind} is not one of {', '.join(DpoLossKind.values())}")
    if kind == "ipo":
        policy, reference = policy.per_token(), reference.per_token()
    h = (policy.chosen - policy.rejected) - (reference.chosen - reference.rejected)
    if kind == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        losses = (-F.logsigmoid(beta * h) * (1 - label_smoothing)
                  - F.logsigmoid(-beta * h) * label_smoothing)
    chosen_reward = beta * (policy.chosen - reference.chosen).detach()
    rejected_reward = beta * (policy.rejected - reference.rejected).detach()
    return DpoLoss(losses.mean(), losses, chosen_reward, rejected_reward, policy.detached())


LN2 = math.log(2)  # the sigmoid loss while the policy is the reference
