"""Group relative policy optimisation (GRPO, Shao et al. 2024): the advantages of sampled answers
from their rewards, and the clipped surrogate loss from the policy's log-probabilities of them, as
TRL's ``GRPOTrainer`` defines them (read at trl f2cd577; ``grpo.loss_type`` grpo | dr_grpo | dapo).

A batch holds the answers to B prompts, G = ``grpo.num_generations`` each, a prompt's next to each
other: N = B·G rows. A row's ``mask`` counts its answer's tokens (not its prompt's, not padding).

Each loss here is this worker's *share* of the loss of the whole batch of an optimizer step (every
worker, every micro-batch): the shares sum to it, so no loss type depends on how the batch is split
(``Whole``). DDP and FSDP2 average the workers' gradients: the worker backpropagates its share
times the number of workers (``Trainee.backward``), which makes that average the shares' sum, the
gradient of the whole batch's loss in one process (tests/integration/test_gradients.py).

Shapes: N rows, T answer tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from raydp_llm.core.grpo_config import GrpoLossType, GrpoSettings, RewardScale
from raydp_llm.models.base import IGNORE
from raydp_llm.training.objectives import all_reduce_sum

STD_FLOOR = 1e-4  # TRL's: added to a standard deviation before it divides
PAD = 0  # left of a shorter prompt, after an answer's end, right of a shorter answer: no mask's


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The sample standard deviation (Bessel's correction) of the values that are not NaN, along
    ``dim`` (all of them: None)."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~x.isnan()).sum(dim=dim)
    return (torch.nanmean((x - mean) ** 2, dim=dim) * count / (count - 1)).sqrt()


def combined_rewards(per_function: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each answer's reward (N,): the weighted sum of what the functions gave it (N, F), a None
    (NaN) counting 0; NaN where no function scored it (no signal: its advantage is 0)."""
    total = (per_function * weights).nansum(dim=1)
    return total.masked_fill(per_function.isnan().all(dim=1), float("nan"))


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor  # (N,): each answer's advantage over its group
    zero_std: torch.Tensor  # (N,) bool: its group's rewards did not vary (frac_reward_zero_std)


def advantages(rewards: torch.Tensor, num_generations: int, scale: str,
               batch_std: float | None = None) -> Advantages:
    """Each answer's reward less its group's mean, divided by the group's (``group``) or the
    batch's (``batch``: ``batch_std``, the whole batch's over every worker, else that of
    ``rewards``) standard deviation, or not (``none``); 0 for an unscored answer (NaN)."""
    groups = rewards.view(-1, num_generations)
    mean = torch.nanmean(groups, dim=1).repeat_interleave(num_generations)
    group_std = nanstd(groups, dim=1).repeat_interleave(num_generations)
    std = group_std
    if scale == RewardScale.batch:
        whole = nanstd(rewards) if batch_std is None else torch.tensor(batch_std)
        std = whole.to(rewards.dtype).expand_as(rewards)
    values = rewards - mean
    if scale != RewardScale.none:
        values = values / (std + STD_FLOOR)
    return Advantages(torch.nan_to_num(values, nan=0.0),
                      torch.isclose(group_std, torch.zeros_like(group_std)))


@dataclass(frozen=True)
class Whole:
    """The batch of one optimizer step, over every worker and micro-batch: what a worker's share
    of the loss is divided by."""

    answers: int  # N over the whole batch (grpo, dr_grpo)
    tokens: int  # answer tokens over the whole batch (dapo)


def whole_of(masks: list[torch.Tensor]) -> Whole:
    """The whole batch's answers and answer tokens: those of this worker's ``masks`` (a (G, L)
    mask per prompt) summed over the workers, where torch.distributed runs."""
    answers, tokens = all_reduce_sum(sum(m.size(0) for m in masks),
                                     sum(int(m.sum()) for m in masks))
    return Whole(answers=int(answers), tokens=int(tokens))


@dataclass(frozen=True)
class PolicyLoss:
    share: torch.Tensor  # this worker's share of the loss (a scalar with its graph)
    clipped_low: torch.Tensor  # answer tokens the clip held below 1 - epsilon (advantage < 0)
    clipped_high: torch.Tensor  # those it held above 1 + epsilon_high (advantage > 0)
    kl_sum: torch.Tensor  # the KL estimate summed over answer tokens (0 without a reference)


UPDATE_SUMS = ("clipped_low", "clipped_high", "kl_sum")  # what each update adds to a step's sums


def policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantage: torch.Tensor,
                mask: torch.Tensor, grpo: GrpoSettings, whole: Whole,
                ref_logps: torch.Tensor | None = None) -> PolicyLoss:
    """The clipped surrogate of ``logps`` (N, T), the policy's log-probabilities of the answers'
    tokens, against ``old_logps`` (N, T), those of the policy that sampled them; ``advantage``
    (N,); plus ``grpo.beta`` × the k3 estimate of the KL divergence to ``ref_logps`` (N, T)."""
    mask = mask.to(logps.dtype)
    ratio = torch.exp(logps - old_logps)
    low, high = 1 - grpo.epsilon, 1 + (grpo.epsilon_high or grpo.epsilon)
    adv = advantage.unsqueeze(1)
    per_token = -torch.min(ratio * adv, ratio.clamp(low, high) * adv)
    kl = torch.zeros_like(per_token)
    if grpo.beta > 0:
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        per_token = per_token + grpo.beta * kl
    clipped_low = ((ratio < low) & (adv < 0)) * mask
    clipped_high = ((ratio > high) & (adv > 0)) * mask
    return PolicyLoss(_share(per_token, mask, grpo, whole), clipped_low.sum().detach(),
                      clipped_high.sum().detach(), (kl * mask).sum().detach())


def _share(per_token: torch.Tensor, mask: torch.Tensor, grpo: GrpoSettings,
           whole: Whole) -> torch.Tensor:
    """This worker's part of the whole batch's loss, by ``grpo.loss_type``."""
    summed = (per_token * mask).sum()
    if grpo.loss_type == GrpoLossType.grpo:
        per_answer = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_answer.sum() / whole.answers
    if grpo.loss_type == GrpoLossType.dr_grpo:
        return summed / (whole.answers * grpo.max_new_tokens)
    return summed / max(whole.tokens, 1)


@dataclass(frozen=True)
class AnswerBatch:
    """Several prompts' answers as one batch for the log-probabilities: each row its prompt,
    left-padded to the longest, then its answer, right-padded with PAD (out of ``mask``) to the
    longest, so that every answer starts at the same position."""

    ids: torch.Tensor  # (N, T + L)
    pads: torch.Tensor | None  # (N,) each row's left padding; None: none is padded
    answers: torch.Tensor  # (N, L)
    mask: torch.Tensor  # (N, L) bool: the answers' own tokens
    advantages: torch.Tensor  # (N,)


def answer_batch(prompts: list[torch.Tensor], answers: list[torch.Tensor],
                 masks: list[torch.Tensor], advantages: list[torch.Tensor]) -> AnswerBatch:
    """One batch of groups: ``prompts`` (T_i,), their answers (G, L_i), masks and advantages."""
    T = max(p.numel() for p in prompts)
    L = max(a.size(1) for a in answers)
    rows, pads = [], []
    for prompt, group in zip(prompts, answers):
        left = T - prompt.numel()
        padded = F.pad(group, (0, L - group.size(1)), value=PAD)
        rows.append(torch.cat([F.pad(prompt, (left, 0), value=PAD).expand(group.size(0), T),
                               padded], dim=1))
        pads += [left] * group.size(0)
    pad_counts = torch.tensor(pads, device=prompts[0].device)
    return AnswerBatch(torch.cat(rows), pad_counts if bool(pad_counts.any()) else None,
                       torch.cat([F.pad(a, (0, L - a.size(1)), value=PAD) for a in answers]),
                       torch.cat([F.pad(m, (0, L - m.size(1)), value=False) for m in masks]),
                       torch.cat(advantages))


def answer_logps(model, batch: AnswerBatch, temperature: float) -> torch.Tensor:
    """The log-probabilities (N, L) the model gives each answer's tokens after its prompt (0 at
    the padding after an answer), its logits divided by the sampling ``temperature`` (as TRL's):
    minus each token's cross-entropy, from the answer positions' hidden states alone (the
    model's ``keep``) through the head in chunks (``token_scores``: no (N, L, V) logits)."""
    L = batch.answers.size(1)
    targets = batch.answers.masked_fill(~batch.mask, IGNORE)
    _, scores = model(batch.ids[:, :-1], targets, pads=batch.pads, keep=L,
                      temperature=temperature)
    return -scores.nats
