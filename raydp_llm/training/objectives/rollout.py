"""GRPO's answers: each prompt's ``grpo.num_generations`` samples, drawn for all of a worker's
prompts of a step together (``answers_to``): prompts left-padded into batches of at most
``grpo.generation_batch_size`` sequences, one cached decode each, the sampling on the model's
device. Each answer's draws are counter-based (draws.py: a hash of seed, step, prompt, sample and
position), so the answers at a step do not depend on the cluster or the batch: 1, 2 or 4 workers,
any ``generation_batch_size``, and a run resumed on another number of workers, draw the same ones.
(Padding changes the order of a batch's float sums, not the draws: an answer differs only if its
uniform number falls within rounding of a token's edge.)

Shapes: R sequences, G samples, T prompt tokens, L answer tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from raydp_llm.core.grpo_config import GrpoSettings
from raydp_llm.training.objectives.draws import answer_key, pick, uniforms
from raydp_llm.training.objectives.grpo_loss import PAD, combined_rewards
from raydp_llm.training.objectives.rewards import RewardCalls, load

END_CHECK = 8  # tokens between looks at whether every answer has ended (each waits on the device)


def alone(done: bool) -> bool:
    """Whether every worker is done, for a model that is not sharded: this one's say is all."""
    return done


def end_ids(tokenizer, end_text: str | None, model=None) -> tuple[int, ...]:
    """The tokens that end an answer: ``end_text`` (a chat template's end of turn) when it is one
    token, the tokenizer's end of document, and every end id a transformers ``model``'s generation
    config lists (Llama 3's list; Qwen's end of turn and end of text)."""
    found = []
    if end_text:
        ids = tokenizer.encode(end_text)
        if len(ids) == 1:
            found.append(int(ids[0]))
    if tokenizer.eod_id is not None:
        found.append(int(tokenizer.eod_id))
    config = getattr(getattr(model, "net", None), "generation_config", None)
    listed = getattr(config, "eos_token_id", None)
    found += [int(i) for i in ([listed] if isinstance(listed, int) else listed or [])]
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class Draw:
    """Which answers to draw: the run's ``seed``, the optimizer ``step`` and the ``prompt``'s
    number in the data."""

    seed: int
    step: int
    prompt: int


@dataclass(frozen=True)
class Answers:
    ids: torch.Tensor  # (G, L) the answers' tokens, PAD after an answer's end
    mask: torch.Tensor  # (G, L) bool: the answer's own tokens (its end token included)


@dataclass(frozen=True)
class Sequence:
    """One answer to draw: its prompt (T,), its key (draws.answer_key) and whose it is."""

    prompt: torch.Tensor
    key: int
    ask: int  # its prompt's place in the asked list
    sample: int


@torch.no_grad()
def answers_to(model, prompts: list[torch.Tensor], draws: list[Draw], grpo: GrpoSettings,
               ends: tuple[int, ...], greedy: bool = False,
               all_done: Callable[[bool], bool] = alone) -> list[Answers]:
    """Each prompt's ``grpo.num_generations`` answers (``greedy``: its one likeliest), of at most
    ``grpo.max_new_tokens`` tokens, an answer ending at any of ``ends``; drawn
    ``grpo.generation_batch_size`` sequences at a time. A sharded model's forwards gather its
    parameters on every worker, so each worker's batch goes on while any worker's has not ended
    (``all_done``: one collective every ``END_CHECK`` tokens)."""
    samples = 1 if greedy else grpo.num_generations
    sequences = [Sequence(p, answer_key(d.seed, d.step, d.prompt, s), i, s)
                 for i, (p, d) in enumerate(zip(prompts, draws)) for s in range(samples)]
    rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    # the GPT and transformers' models read left-padded prompts; the LSTM's state would read the
    # padding
    length = None if model.pads_prompts else (lambda s: s.prompt.numel())
    for batch in batched(sequences, grpo.generation_batch_size, lambda s: 1, length):
        ids, owned = _decode(model, batch, grpo, ends, greedy, all_done)
        for r, s in enumerate(batch):
            rows[s.ask, s.sample] = (ids[r], owned[r])
    return [_group([rows[i, s] for s in range(samples)]) for i in range(len(prompts))]


def batched(items: list, size: int, rows: Callable[[object], int],
            length: Callable[[object], int] | None = None) -> list[list]:
    """``items`` in order, in batches of at most ``size`` rows (``rows`` of each; an item larger
    than ``size`` alone). With ``length`` (for a model that reads no left padding: its prompts'),
    a batch's items are all of one length."""
    by_length: dict[int, list] = {}
    for item in items:
        by_length.setdefault(length(item) if length else 0, []).append(item)
    found = []
    for same in by_length.values():
        batch, held = [], 0
        for item in same:
            if batch and held + rows(item) > size:
                found.append(batch)
                batch, held = [], 0
            batch.append(item)
            held += rows(item)
        found.append(batch)
    return found


def _left_padded(batch: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The batch's prompts (R, T) left-padded with PAD, and each row's padding (R,) (None: none
    is padded)."""
    longest = max(s.prompt.numel() for s in batch)
    device = batch[0].prompt.device
    pads = torch.tensor([longest - s.prompt.numel() for s in batch], device=device)
    idx = torch.stack([F.pad(s.prompt, (longest - s.prompt.numel(), 0), value=PAD)
                       for s in batch])
    return idx, pads if bool(pads.any()) else None


def _decode(model, batch: list[Sequence], grpo: GrpoSettings, ends: tuple[int, ...],
            greedy: bool, all_done: Callable[[bool], bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """One cached decode of a batch: its answers' tokens (R, L) and which are their own (R, L)."""
    idx, pads = _left_padded(batch)
    device = idx.device
    keys = torch.tensor([s.key for s in batch], dtype=torch.int64, device=device)
    stops = torch.tensor(ends, dtype=torch.long, device=device)
    ended = torch.zeros(len(batch), dtype=torch.bool, device=device)
    tokens, owned, state = [], [], None
    for position in range(grpo.max_new_tokens):
        logits, state = model.next_logits(idx, state, pads=pads)  # (R, V)
        if greedy:
            nxt = logits.argmax(dim=-1)
        else:
            probs = F.softmax(logits.float() / grpo.temperature, dim=-1)
            nxt = pick(probs, uniforms(keys, position), grpo.top_p)
        owned.append(~ended)
        nxt = nxt.masked_fill(ended, PAD)
        tokens.append(nxt)
        ended = ended | torch.isin(nxt, stops)
        idx = torch.cat([idx, nxt.unsqueeze(1)], dim=1)
        if (position + 1) % END_CHECK == 0 and all_done(bool(ended.all())):
            break
    return torch.stack(tokens, dim=1), torch.stack(owned, dim=1)


def _group(rows: list[tuple[torch.Tensor, torch.Tensor]]) -> Answers:
    """A prompt's answers from their batches' rows, as long as its longest answer."""
    length = max(int(owned.nonzero().max()) + 1 if owned.any() else 1 for _, owned in rows)
    ids = torch.stack([F.pad(i, (0, max(0, length - i.numel())), value=PAD)[:length]
                       for i, _ in rows])
    mask = torch.stack([F.pad(m, (0, max(0, length - m.numel())), value=False)[:length]
                        for _, m in rows])
    return Answers(ids, mask)


def answer(model, prompt: torch.Tensor, draw: Draw, grpo: GrpoSettings, ends: tuple[int, ...],
           greedy: bool = False, all_done: Callable[[bool], bool] = alone) -> Answers:
    """One prompt's answers (``answers_to``)."""
    return answers_to(model, [prompt], [draw], grpo, ends, greedy, all_done)[0]


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
    tokens that end an answer, and the ``rewards`` (rewards.Reward) called through ``calls``
    (rewards.RewardCalls)."""

    decode: object
    end_ids: tuple[int, ...]
    calls: object
    rewards: list


def completion_texts(answers: Answers, scoring: Scoring) -> list[str]:
    """Each answer's text: its own tokens decoded, its end token left out."""
    return [scoring.decode([t for t, own in zip(row, mask) if own and t not in scoring.end_ids])
            for row, mask in zip(answers.ids.tolist(), answers.mask.tolist())]


def scoring_for(grpo: GrpoSettings, tokenizer, end_text: str | None, model=None) -> Scoring:
    """``grpo.rewards`` (found; their columns were checked at the door), called in a process of
    their own within ``grpo.reward_timeout_s``, on answers decoded by ``tokenizer`` and ended at
    ``end_text`` or the ``model``'s end ids (``end_ids``): the worker's scoring, and
    ``evaluate``'s. Close its ``calls`` when done."""
    return Scoring(tokenizer.decode, end_ids(tokenizer, end_text, model),
                   RewardCalls(grpo.reward_timeout_s, tuple(grpo.rewards)),
                   load(grpo.rewards, None))


def weights_of(grpo: GrpoSettings) -> torch.Tensor:
    """Each reward's weight in the sum: ``grpo.reward_weights``, or 1 each."""
    return torch.tensor(grpo.reward_weights or [1.0] * len(grpo.rewards))


def roll_out(model, prompts: list[PromptRow], draws: list[Draw], grpo: GrpoSettings,
             scoring: Scoring, greedy: bool = False,
             all_done: Callable[[bool], bool] = alone) -> list[Group]:
    """Each prompt's answers (``answers_to``; ``greedy``: its one likeliest), decoded and scored
    by each reward as TRL calls them: the prompt and its columns repeated for each answer, a
    prompt's answers a batch of their own (a reward that fails costs that prompt's)."""
    found = answers_to(model, [p.ids for p in prompts], draws, grpo, scoring.end_ids, greedy,
                       all_done)
    return [scored(prompt, answers, scoring) for prompt, answers in zip(prompts, found)]


def scored(prompt: PromptRow, answers: Answers, scoring: Scoring) -> Group:
    """A prompt's answers, decoded and scored by each reward."""
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


def greedy_draws(prompts: list[PromptRow]) -> list[Draw]:
    """A greedy answer draws nothing: its draw only names its prompt."""
    return [Draw(0, 0, p.index) for p in prompts]


@torch.no_grad()
def evaluate(model, prompts: list[PromptRow], grpo: GrpoSettings, scoring: Scoring,
             weights: torch.Tensor, all_done: Callable[[bool], bool] = alone) -> Evaluation:
    """One greedy answer (``grpo.max_new_tokens``) to each of ``prompts``, scored (``val_reward``,
    and ``python -m raydp_llm.evaluate`` on prompts)."""
    groups = roll_out(model, prompts, greedy_draws(prompts), grpo, scoring, greedy=True,
                      all_done=all_done)
    scores = torch.cat([g.per_function for g in groups])  # (P, F)
    total = combined_rewards(scores, weights).nan_to_num(nan=0.0)  # unscored: 0
    return Evaluation(float(total.mean()),
                      {r.name: float(torch.nanmean(scores[:, i]))
                       for i, r in enumerate(scoring.rewards)},
                      [g.completions[0] for g in groups])


def sample_lines(model, tokenizer, prompts: list[PromptRow], grpo: GrpoSettings,
                 end_text: str | None) -> str:
    """``samples.txt`` of a GRPO run: each prompt and the model's greedy answer."""
    scoring = Scoring(tokenizer.decode, end_ids(tokenizer, end_text, model), None, [])
    found = answers_to(model, [p.ids for p in prompts], greedy_draws(prompts), grpo,
                       scoring.end_ids, greedy=True)
    lines = []
    for prompt, answers in zip(prompts, found):
        lines += [f"prompt: {prompt.text}", f"answer: {completion_texts(answers, scoring)[0]}",
                  ""]
    return "\n".join(lines)
