"""GRPO's answers: a prompt's ``grpo.num_generations`` samples, drawn together as one batch with the
model's cache (``next_logits``), each from its own random stream seeded by (seed, step, prompt,
sample). So the answers at a step do not depend on the cluster: 1, 2 or 4 workers, and a run
resumed on another number of workers, draw the same ones (a prompt's group is the same batch on
any worker; no stream is shared with another prompt's).

Shapes: G samples, T prompt tokens, L answer tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from raydp_llm.core.grpo_config import GrpoSettings
from raydp_llm.training.objectives.grpo_loss import combined_rewards
from raydp_llm.training.objectives.rewards import RewardCalls, load

PAD = 0  # after an answer's end; its mask leaves it out


def alone(done: bool) -> bool:
    """Whether every worker is done, for a model that is not sharded: this one's say is all."""
    return done


def end_id(tokenizer, end_text: str | None) -> int | None:
    """The token that ends an answer: ``end_text`` (a chat template's end of turn) when it is one
    token, else the tokenizer's end of document."""
    if end_text:
        ids = tokenizer.encode(end_text)
        if len(ids) == 1:
            return int(ids[0])
    return tokenizer.eod_id


def stream_seed(seed: int, step: int, prompt: int, sample: int) -> int:
    """The seed of one sample's random stream: ``prompt`` is its index in the dataset."""
    return int(np.random.SeedSequence([seed, step, prompt, sample]).generate_state(1)[0])


@dataclass(frozen=True)
class Draw:
    """Which answers to draw: the run's ``seed``, the optimizer ``step`` and the ``prompt``'s
    index in the dataset."""

    seed: int
    step: int
    prompt: int


@dataclass(frozen=True)
class Answers:
    ids: torch.Tensor  # (G, L) the answers' tokens, PAD after an answer's end
    mask: torch.Tensor  # (G, L) bool: the answer's own tokens (its end token included)


def pick(probs: torch.Tensor, generators: list[torch.Generator], top_p: float) -> torch.Tensor:
    """One token per row of ``probs`` (G, V), each from its own generator: the inverse of the row's
    distribution (its nucleus, with ``top_p`` < 1) at one uniform draw."""
    if top_p < 1:
        ranked, order = probs.sort(dim=-1, descending=True)
        before = ranked.cumsum(dim=-1) - ranked  # the mass of the likelier tokens
        probs = torch.zeros_like(probs).scatter(-1, order, ranked * (before < top_p))
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
    cdf = probs.double().cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1)).squeeze(1)
    return tokens.clamp(max=probs.size(-1) - 1)


@torch.no_grad()
def answer(model, prompt: torch.Tensor, draw: Draw, grpo: GrpoSettings, end_id: int | None,
           greedy: bool = False, all_done: Callable[[bool], bool] = alone) -> Answers:
    """``grpo.num_generations`` answers to ``prompt`` (T,) drawn at ``grpo.temperature`` (or,
    ``greedy``, the one likeliest: an evaluation's answer), of at most ``grpo.max_new_tokens``
    tokens each, an answer ending at ``end_id``. A sharded model's forwards gather its parameters
    on every worker, so each worker's answers go on while any worker's have not ended
    (``all_done``: one collective a token); the tokens after an answer's end are PAD, out of its
    mask."""
    samples = 1 if greedy else grpo.num_generations
    generators = [torch.Generator().manual_seed(stream_seed(draw.seed, draw.step, draw.prompt, s))
                  for s in range(samples)]
    idx = prompt.unsqueeze(0).repeat(samples, 1)  # (G, T)
    ended = torch.zeros(samples, dtype=torch.bool, device=prompt.device)
    tokens, owned, state = [], [], None
    for _ in range(grpo.max_new_tokens):
        logits, state = model.next_logits(idx, state)  # (G, V)
        if greedy:
            nxt = logits.argmax(dim=-1)
        else:
            probs = F.softmax(logits.float().cpu() / grpo.temperature, dim=-1)
            nxt = pick(probs, generators, grpo.top_p).to(prompt.device)
        owned.append(~ended)
        nxt = nxt.masked_fill(ended, PAD)
        tokens.append(nxt)
        if end_id is not None:
            ended = ended | (nxt == end_id)
        idx = torch.cat([idx, nxt.unsqueeze(1)], dim=1)
        if all_done(bool(ended.all())):
            break
    return Answers(torch.stack(tokens, dim=1), torch.stack(owned, dim=1))


@dataclass(frozen=True)
class PromptRow:
    """A prompt of the data: its index in the dataset (its answers' streams), its tokens (T,) and
    text, and its other columns' values (what the rewards may ask for)."""

    index: int
    ids: torch.Tensor
    text: str
    columns: dict


@dataclass(frozen=True)
class Group:
    """A prompt's answers and their scores: ``per_function`` (G, F), NaN where a function gave
    None; ``errors`` by reward spec, that function's error if its batch failed."""

    prompt: PromptRow
    answers: Answers
    completions: list[str]
    per_function: torch.Tensor
    errors: dict


@dataclass(frozen=True)
class Scoring:
    """How answers become scores: ``decode`` (token ids → text, special tokens skipped), the
    token that ends an answer, and the ``rewards`` (rewards.Reward) called through ``calls``
    (rewards.RewardCalls)."""

    decode: object
    end_id: int | None
    calls: object
    rewards: list


def completion_texts(answers: Answers, scoring: Scoring) -> list[str]:
    """Each answer's text: its own tokens decoded, its end token left out."""
    return [scoring.decode([t for t, own in zip(row, mask) if own and t != scoring.end_id])
            for row, mask in zip(answers.ids.tolist(), answers.mask.tolist())]


def scoring_for(grpo: GrpoSettings, tokenizer, end_text: str | None) -> Scoring:
    """``grpo.rewards`` (found; their columns were checked at the door), called in a process of
    their own within ``grpo.reward_timeout_s``, on answers decoded by ``tokenizer`` and ended at
    ``end_text``: the worker's scoring, and ``evaluate``'s. Close its ``calls`` when done."""
    return Scoring(tokenizer.decode, end_id(tokenizer, end_text),
                   RewardCalls(grpo.reward_timeout_s, tuple(grpo.rewards)),
                   load(grpo.rewards, None))


def weights_of(grpo: GrpoSettings) -> torch.Tensor:
    """Each reward's weight in the sum: ``grpo.reward_weights``, or 1 each."""
    return torch.tensor(grpo.reward_weights or [1.0] * len(grpo.rewards))


def roll_out(model, prompt: PromptRow, draw: Draw, grpo: GrpoSettings, scoring: Scoring,
             greedy: bool = False, all_done: Callable[[bool], bool] = alone) -> Group:
    """``prompt``'s answers (``answer``; ``greedy``: its one likeliest), decoded and scored by
    each reward as TRL calls them: the prompt and its columns repeated for each answer."""
    if greedy:
        answers = answer(model, prompt.ids, draw, grpo, scoring.end_id, greedy=True,
                         all_done=all_done)
    else:
        answers = answer(model, prompt.ids, draw, grpo, scoring.end_id, all_done=all_done)
    completions = completion_texts(answers, scoring)
    n, rewards = len(completions), scoring.rewards
    columns = {k: [v] * n for k, v in prompt.columns.items()}
    scores = [scoring.calls.score(r.spec, [prompt.text] * n, completions, columns)
              for r in rewards]
    values = [[float("nan") if v is None else v for v in s.values] for s in scores]
    return Group(prompt, answers, completions, torch.tensor(values).T.reshape(n, len(rewards)),
                 {r.spec: s.error for r, s in zip(rewards, scores)})


@dataclass(frozen=True)
class Evaluation:
    """Greedy answers to held-out prompts, scored: the mean reward over them (the rewards' weighted
    sum; an answer no function scored counts 0) and each function's mean over those it scored."""

    reward: float
    per_function: dict[str, float]
    answers: list[str]


@torch.no_grad()
def evaluate(model, prompts: list[PromptRow], grpo: GrpoSettings, scoring: Scoring,
             weights: torch.Tensor, all_done: Callable[[bool], bool] = alone) -> Evaluation:
    """One greedy answer (``grpo.max_new_tokens``) to each of ``prompts``, scored (``val_reward``,
    and ``python -m raydp_llm.evaluate`` on prompts)."""
    groups = [roll_out(model, p, Draw(0, 0, p.index), grpo, scoring, greedy=True,
                       all_done=all_done)
              for p in prompts]
    scores = torch.cat([g.per_function for g in groups])  # (P, F)
    total = combined_rewards(scores, weights).nan_to_num(nan=0.0)  # unscored: 0
    return Evaluation(float(total.mean()),
                      {r.name: float(torch.nanmean(scores[:, i]))
                       for i, r in enumerate(scoring.rewards)},
                      [g.completions[0] for g in groups])


def sample_lines(model, tokenizer, prompts: list[PromptRow], grpo: GrpoSettings,
                 end_text: str | None) -> str:
    """``samples.txt`` of a GRPO run: each prompt and the model's greedy answer."""
    scoring = Scoring(tokenizer.decode, end_id(tokenizer, end_text), None, [])  # no rewards
    lines = []
    for prompt in prompts:
        answers = answer(model, prompt.ids, Draw(0, 0, prompt.index), grpo, scoring.end_id,
                         greedy=True)
        lines += [f"prompt: {prompt.text}", f"answer: {completion_texts(answers, scoring)[0]}",
                  ""]
    return "\n".join(lines)
