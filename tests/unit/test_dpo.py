"""The DPO objective (training/objectives/dpo_loss.py) against the paper's formula computed here,
directly from a
transformers model's logits: at the start (policy = reference) the loss is ln 2 and every reward 0;
then the loss, rewards and log-probabilities of a batch; IPO and label smoothing; and a planted
preference that a few steps of the loss learn."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from helpers.scores import whole_scores
from raydp_llm.models.base import IGNORE
from raydp_llm.training.objectives.dpo_loss import LN2, PairLogps, dpo_loss, means

P, PROMPT, ANSWER, V = 3, 4, 5, 37


def _llama(seed: int):
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    return tf.LlamaForCausalLM(cfg).eval()


def _pairs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of P pairs: (2P, T) ids (chosen rows, then rejected rows: each its prompt then
    its answer) and the targets (the next token, counted on the answer's tokens only)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, V, (P, PROMPT), generator=g)
    answers = torch.randint(0, V, (2 * P, ANSWER), generator=g)
    ids = torch.cat([prompts.repeat(2, 1), answers], dim=1)
    targets = torch.full_like(ids, IGNORE)
    targets[:, PROMPT - 1:-1] = ids[:, PROMPT:]  # the answer's tokens, predicted one step early
    return ids, targets


def _by_hand(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each row's answer log-probability: log-softmax, the answer's ids picked, summed."""
    logp = torch.log_softmax(logits.double(), dim=-1)[:, PROMPT - 1:-1]  # predicts ids[PROMPT:]
    return logp.gather(-1, ids[:, PROMPT:, None]).squeeze(-1).sum(dim=1)


def test_at_the_first_step_the_loss_is_ln2_and_every_reward_zero():
    ids, targets = _pairs()
    model = _llama(0)
    logits = model(ids).logits
    same = PairLogps.of(whole_scores(logits, targets))
    out = dpo_loss(same, PairLogps.of(whole_scores(logits.detach(), targets)), beta=0.1)
    assert abs(out.loss.item() - math.log(2)) < 1e-6 and abs(LN2 - math.log(2)) < 1e-12
    assert torch.all(out.chosen_reward == 0) and torch.all(out.rejected_reward == 0)
    out.loss.backward()  # the gradient flows to the policy at the start
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("beta,smoothing", [(0.1, 0.0), (0.5, 0.2)])
def test_the_sigmoid_loss_rewards_and_logps_are_the_papers(beta, smoothing):
    ids, targets = _pairs()
    with torch.no_grad():
        policy_logits, reference_logits = _llama(0)(ids).logits, _llama(7)(ids).logits
    policy = PairLogps.of(whole_scores(policy_logits, targets))
    reference = PairLogps.of(whole_scores(reference_logits, targets))
    pi, ref = _by_hand(policy_logits, ids), _by_hand(reference_logits, ids)
    assert torch.allclose(policy.chosen.double(), pi[:P], atol=1e-4)
    assert torch.allclose(policy.rejected.double(), pi[P:], atol=1e-4)
    assert torch.all(policy.chosen_tokens == ANSWER)

    h = (pi[:P] - pi[P:]) - (ref[:P] - ref[P:])
    expected = (-(1 - smoothing) * F.logsigmoid(beta * h) - smoothing * F.logsigmoid(-beta * h))
    out = dpo_loss(policy, reference, beta=beta, label_smoothing=smoothing)
    assert torch.allclose(out.losses.double(), expected, atol=1e-5)
    assert abs(out.loss.item() - expected.mean().item()) < 1e-5
    assert torch.allclose(out.chosen_reward.double(), beta * (pi[:P] - ref[:P]), atol=1e-5)
    assert torch.allclose(out.rejected_reward.double(), beta * (pi[P:] - ref[P:]), atol=1e-5)
    m = means(out.sums())
    margin = beta * ((pi[:P] - ref[:P]) - (pi[P:] - ref[P:]))
    assert abs(m["reward_margin"] - margin.mean().item()) < 1e-5
    assert m["reward_accuracy"] == pytest.approx((margin > 0).double().mean().item())
    assert m["chosen_logp"] == pytest.approx(pi[:P].mean().item(), abs=1e-4)


def test_ipo_is_its_squared_loss_on_per_token_log_probabilities():
    ids, targets = _pairs()
    with torch.no_grad():
        policy_logits, reference_logits = _llama(0)(ids).logits, _llama(7)(ids).logits
    pi, ref = _by_hand(policy_logits, ids) / ANSWER, _by_hand(reference_logits, ids) / ANSWER
    h = (pi[:P] - pi[P:]) - (ref[:P] - ref[P:])
    policy = PairLogps.of(whole_scores(policy_logits, targets))
    reference = PairLogps.of(whole_scores(reference_logits, targets))
    out = dpo_loss(policy, reference, beta=0.25, kind="ipo")
    assert torch.allclose(out.losses.double(), (h - 1 / (2 * 0.25)) ** 2, atol=1e-5)
    with pytest.raises(ValueError, match="dpo.loss=kto is not one of sigmoid, ipo"):
        dpo_loss(policy, reference, beta=0.1, kind="kto")


def test_a_planted_preference_is_learned():
    """The chosen answer repeats the prompt's first token, the rejected does not: a few Adam
    steps of the DPO loss rank every pair right, and the reference stays where it was."""
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, V, (16, PROMPT), generator=g)
    chosen = prompts[:, :1].repeat(1, ANSWER)
    rejected = (chosen + 1 + torch.randint(0, V - 1, chosen.shape, generator=g)) % V
    ids = torch.cat([prompts.repeat(2, 1), torch.cat([chosen, rejected])], dim=1)
    targets = torch.full_like(ids, IGNORE)
    targets[:, PROMPT - 1:-1] = ids[:, PROMPT:]
    policy, reference = _llama(0).train(), _llama(0)
    with torch.no_grad():
        ref = PairLogps.of(whole_scores(reference(ids).logits, targets))
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    for _ in range(30):
        out = dpo_loss(PairLogps.of(whole_scores(policy(ids).logits, targets)), ref, beta=0.1)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert out.loss.item() < 0.3 * LN2
    assert means(out.sums())["reward_accuracy"] == 1.0
