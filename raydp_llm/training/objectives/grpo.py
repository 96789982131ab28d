"""``train.objective=grpo``, learning from rewards on one worker: its prompts (``PromptShare``),
and the step (``Grpo.step``): its prompts' answers drawn with the model's cache and scored by the
user's rewards (rollout.py), their advantages over their groups, then ``grpo.num_iterations``
updates of the clipped surrogate (grpo_loss.py): each worker's loss is its share of the whole
batch's, and the reduced gradient the whole batch's (``Trainee.backward``).

``train.batch_size`` prompts a step over all workers: the step's prompts are the next
``batch_size`` of the epoch's seeded order of the training prompts, worker ``r`` of ``W`` taking
the ``r``-th ``1/W`` of them. Each answer's random stream is seeded by (seed, step, prompt,
sample), so 1, 2 or 4 workers, and a run resumed on another number of workers, draw the same
answers at a step.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import torch

from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.core.timing import Stopwatch
from raydp_llm.training.objectives import (
    Interval,
    Objective,
    StepResult,
    Trainee,
    all_reduce_max,
    all_reduce_sum,
    every_worker_done,
)
from raydp_llm.training.objectives.grpo_loss import (
    UPDATE_SUMS,
    Advantages,
    AnswerBatch,
    advantages,
    answer_batch,
    answer_logps,
    combined_rewards,
    policy_loss,
    whole_of,
)
from raydp_llm.training.objectives.reference import evaluating, reference_weights
from raydp_llm.training.objectives.rewards import FailureStreak
from raydp_llm.training.objectives.rollout import (
    Draw,
    Group,
    PromptRow,
    alone,
    answer,
    batched,
    evaluate,
    roll_out,
    scoring_for,
    weights_of,
)
from raydp_llm.training.spec import TrainSpec


def prompt_rows(table) -> list[PromptRow]:
    """A split's table (data/prompts/dataset.py) as prompts: number, ids, text, other columns."""
    return [PromptRow(index, torch.from_numpy(np.frombuffer(ids, np.int32).astype(np.int64)),
                      text, json.loads(columns))
            for index, ids, text, columns in zip(*(table.column(c).to_pylist()
                                                   for c in ("index", "ids", "text", "columns")))]


class PromptShare:
    """One worker's prompts: its share of each step's batch (the epoch's seeded order), and its
    contiguous share of the validation prompts an evaluation answers: the first
    ``train.eval_batches`` × ``train.batch_size`` of them (null: all)."""

    def __init__(self, spec, data: dict, rank: int, world: int):
        self.spec, self.rank, self.world = spec, rank, world
        self.train = prompt_rows(data["train"].table())
        val = prompt_rows(data["val"].table())
        if spec.train.eval_batches is not None:
            val = val[:spec.train.eval_batches * spec.train.batch_size]
        self.val = val[rank * len(val) // world:(rank + 1) * len(val) // world]
        self.epoch_reads = {"epoch": None, "windows": 0, "chunks": 0}

    def steps(self, epoch: int, first_step: int):
        """This worker's prompts for the optimizer steps ``first_step..`` of ``epoch``."""
        spec, batch = self.spec, self.spec.train.batch_size
        order = np.random.default_rng([spec.seed, epoch]).permutation(len(self.train))
        lo, hi = self.rank * batch // self.world, (self.rank + 1) * batch // self.world
        for step in range(first_step, spec.steps_per_epoch):
            picked = order[step * batch + lo:step * batch + hi]
            self.epoch_reads = {"epoch": epoch, "windows": (step + 1) * (hi - lo), "chunks": 0}
            yield [self.train[i] for i in picked]


@dataclass(frozen=True)
class Scored:
    """A step's groups with their rewards (N,) and advantages over their groups."""

    groups: list[Group]
    rewards: list[torch.Tensor]
    advantages: list[Advantages]
    whole: BatchRewards  # the whole batch's (every worker's) scored rewards


@dataclass(frozen=True)
class BatchRewards:
    """The mean and standard deviation of a step's scored rewards over every worker."""

    mean: float
    std: float


class Grpo(Objective):
    """Learning from rewards on this worker: its prompts (``PromptShare``), the reward functions'
    process, and with ``grpo.beta`` > 0 the worker's reference model (its LoRA adapters off, or a
    frozen copy)."""

    def __init__(self, trainee: Trainee, data: dict):
        spec, placement = trainee.spec, trainee.placement
        self.trainee, self.spec, grpo = trainee, spec, spec.grpo
        self.data = PromptShare(spec, data, placement.rank, placement.world_size)
        self.scoring = scoring_for(grpo, spec.tokenizer(), spec.answer_end, trainee.model)
        self.calls, self.weights = self.scoring.calls, weights_of(grpo)
        self.streak = FailureStreak(self.scoring.rewards, grpo.max_reward_failures)
        self.tokens_seen = 0.0  # answers vary in length: counted as they come
        # a sharded model's workers answer together: each answer goes on while any has not ended
        self.all_done = every_worker_done if trainee.sharded else alone
        # the live tokens/s: the prompts' longest answers
        self.tokens_per_step = spec.train.batch_size * grpo.num_generations * grpo.max_new_tokens

    @staticmethod
    def wants_reference(spec: TrainSpec) -> bool:
        return spec.grpo.beta > 0

    def step(self, prompts: list[PromptRow], step: int) -> StepResult:
        """Answers to this worker's ``prompts`` at ``step``, scored; then the updates."""
        clock = Stopwatch()
        scored = self._scored(self._rolled_out(prompts, step))
        gen_s, clock = clock.seconds(), Stopwatch()
        loss, grad_norm, figures = self._updates(scored)
        sums = self._figures(scored, figures) | {"gen_s": gen_s, "train_s": clock.seconds()}
        return StepResult(loss, 0, int(sums["answer_tokens"]), grad_norm, sums,
                          live={"reward": scored.whole.mean, "reward_std": scored.whole.std})

    @torch.no_grad()
    def _rolled_out(self, prompts: list[PromptRow], step: int) -> list[Group]:
        model, grpo = self.trainee.model, self.spec.grpo
        with evaluating(model), self.trainee.autocast():
            return roll_out(model, [self._placed_prompt(p) for p in prompts],
                            [Draw(self.spec.seed, step, p.index) for p in prompts], grpo,
                            self.scoring, all_done=self.all_done)

    def _placed_prompt(self, prompt: PromptRow) -> PromptRow:
        ids = prompt.ids.to(self.trainee.device)
        return PromptRow(prompt.index, ids, prompt.text, prompt.columns)

    def _scored(self, groups: list[Group]) -> Scored:
        """Each answer's reward and advantage; the failure streak (over every worker) counted."""
        grpo = self.spec.grpo
        rewards = [combined_rewards(g.per_function, self.weights) for g in groups]
        self._count_failures(groups)
        whole = self._batch_rewards(rewards)  # one collective a step
        return Scored(groups, rewards,
                      [advantages(r, grpo.num_generations, grpo.scale_rewards, whole.std)
                       for r in rewards], whole)

    def _batch_rewards(self, rewards: list[torch.Tensor]) -> BatchRewards:
        """The whole batch's scored rewards (every worker's): their mean and standard
        deviation."""
        flat = torch.cat(rewards)
        ok = flat[~flat.isnan()].double()
        n, total, sq = all_reduce_sum(len(ok), float(ok.sum()), float((ok ** 2).sum()))
        if n == 0:
            return BatchRewards(math.nan, 0.0)
        std = math.sqrt(max(sq - total * total / n, 0.0) / (n - 1)) if n > 1 else 0.0
        return BatchRewards(total / n, std)

    def _count_failures(self, groups: list[Group]) -> None:
        """A function that failed on every batch of every worker this step adds to its streak."""
        specs = [r.spec for r in self.scoring.rewards]
        worked = all_reduce_sum(*(sum(g.errors[s] is None for g in groups) for s in specs))
        errors = {s: next((g.errors[s] for g in groups if g.errors[s]), "on every worker")
                  for s in specs}
        self.streak.step({s: errors[s] if ok == 0 else None for s, ok in zip(specs, worked)})

    def _updates(self, scored: Scored) -> tuple[float, float, dict]:
        """``grpo.num_iterations`` optimizer updates on the step's answers: the loss (this
        worker's share, the last update's), the last gradient norm, and the clip and KL sums over
        every update (TRL logs each update's)."""
        grpo, groups = self.spec.grpo, scored.groups
        whole = whole_of([g.answers.mask for g in groups])
        batches = self._answer_batches(scored)
        old = self._logps(batches, self.trainee.model) if grpo.num_iterations > 1 else None
        ref = self._reference_logps(batches) if grpo.beta > 0 else [None] * len(batches)
        figures, loss, grad_norm = dict.fromkeys(UPDATE_SUMS, 0.0), 0.0, math.nan
        for _ in range(grpo.num_iterations):
            self.trainee.clear_gradients()
            loss, sums = self._backward(batches, old, ref, whole)
            figures = {k: figures[k] + sums[k] for k in UPDATE_SUMS}
            grad_norm = self.trainee.update()
        return loss, grad_norm, figures

    def _answer_batches(self, scored: Scored) -> list[AnswerBatch]:
        """The step's answers as the update's batches of at most ``grpo.update_batch_size``
        answers (null: ``generation_batch_size``), each one forward and backward; a group
        larger than that is split (its advantages are its own already). A model that reads no
        left padding gets prompts of one length a batch."""
        device, groups, grpo = self.trainee.device, scored.groups, self.spec.grpo
        size = grpo.update_batch_size or grpo.generation_batch_size
        pieces = [(i, rows) for i, g in enumerate(groups)
                  for rows in _spans(g.answers.ids.size(0), size)]
        length = None if self.trainee.model.pads_prompts else (
            lambda piece: groups[piece[0]].prompt.ids.numel())
        found = []
        for chunk in batched(pieces, size, lambda piece: piece[1].stop - piece[1].start, length):
            found.append(answer_batch([groups[i].prompt.ids for i, _ in chunk],
                                      [groups[i].answers.ids[rows] for i, rows in chunk],
                                      [groups[i].answers.mask[rows] for i, rows in chunk],
                                      [scored.advantages[i].values[rows].to(device)
                                       for i, rows in chunk]))
        return found

    def _backward(self, batches: list[AnswerBatch], old, ref, whole) -> tuple[float, dict]:
        """This worker's share of the loss, backward, a batch at a time (the gradients reduced
        over the workers after the last). Every worker has as many batches: checks.py holds
        ``train.batch_size`` to a multiple of the workers."""
        grpo, trainee, loss = self.spec.grpo, self.trainee, 0.0
        sums = dict.fromkeys(UPDATE_SUMS, 0.0)
        for i, batch in enumerate(batches):
            with trainee.accumulating(last=i == len(batches) - 1):
                with trainee.autocast():
                    logps = answer_logps(trainee.forward, batch, grpo.temperature)
                    out = policy_loss(logps, logps.detach() if old is None else old[i],
                                      batch.advantages, batch.mask, grpo, whole, ref[i])
                trainee.backward(out.share)
            loss += out.share.item()
            sums = {k: v + float(getattr(out, k)) for k, v in sums.items()}
        return loss, sums

    @torch.no_grad()
    def _logps(self, batches: list[AnswerBatch], model) -> list[torch.Tensor]:
        temperature = self.spec.grpo.temperature
        with self.trainee.autocast():
            return [answer_logps(model, b, temperature).float() for b in batches]

    def _reference_logps(self, batches: list[AnswerBatch]) -> list[torch.Tensor]:
        """The reference's log-probabilities of the answers: the model with its adapters off
        (LoRA), or the frozen copy."""
        with reference_weights(self.trainee.model, self.trainee.reference) as weights:
            return self._logps(batches, weights)

    def _figures(self, scored: Scored, update: dict) -> dict:
        """The step's sums for the metrics (``rollout_columns`` reads them), each function's too."""
        groups = scored.groups
        rewards = torch.cat(scored.rewards)
        ok = rewards[~rewards.isnan()].double()  # summed over workers: their order must not tell
        per_function = torch.cat([g.per_function for g in groups])
        sums = {"answers": float(rewards.numel()), "scored": float(ok.numel()),
                "reward_sum": float(ok.sum()), "reward_sq": float((ok ** 2).sum()),
                "zero_std": float(sum(bool(a.zero_std[0]) for a in scored.advantages)),
                "groups": float(len(groups)),
                "answer_tokens": float(sum(int(g.answers.mask.sum()) for g in groups)),
                "reward_failures": float(sum(e is not None for g in groups
                                             for e in g.errors.values())),
                "prompt_tokens": float(sum(g.prompt.ids.numel() * g.answers.ids.size(0)
                                           for g in groups)), **update}
        for i, reward in enumerate(self.scoring.rewards):
            column = per_function[:, i]
            sums[f"fn_sum_{reward.name}"] = float(column.nansum())
            sums[f"fn_n_{reward.name}"] = float((~column.isnan()).sum())
        return sums

    def columns(self, interval: Interval, state: TrainState) -> dict:
        """The interval's rewards and answers over every worker, and ``val_reward`` (greedy
        answers to the held-out prompts)."""
        world = self.trainee.placement.world_size
        keys = sorted(interval.sums)
        s = dict(zip(keys, all_reduce_sum(*(interval.sums[k] for k in keys))))
        train_loss, = all_reduce_sum(interval.loss)
        self.tokens_seen += s["answer_tokens"] + s["prompt_tokens"]  # since this worker started
        return {
            "tokens": self.tokens_seen, "train_loss": train_loss / interval.steps,
            "val_loss": None,  # the held-out prompts' answers are scored, not a loss
            "tokens_per_s": (s["answer_tokens"] + s["prompt_tokens"]) / interval.clock.seconds(),
            "windows_read": self.data.epoch_reads["windows"],
            **rollout_columns(s, [r.name for r in self.scoring.rewards], world,
                              self.spec.grpo.num_iterations),
            **self._validation_rewards(),
        }

    @torch.no_grad()
    def _validation_rewards(self) -> dict:
        """``val_reward`` and ``val_reward_<function>``: one greedy answer per held-out prompt,
        this worker's share, summed over the workers (None without validation prompts)."""
        names, n = [r.name for r in self.scoring.rewards], len(self.data.val)
        mine = [0.0] * (1 + len(names))  # a worker with no held-out prompts adds nothing
        batches = -(-n // self.spec.grpo.generation_batch_size)  # its greedy answers' batches
        model, most = self.trainee.model, self._most_batches(batches)  # before any collective
        with evaluating(model), self.trainee.autocast():
            if n:
                found = evaluate(model, [self._placed_prompt(p) for p in self.data.val],
                                 self.spec.grpo, self.scoring, self.weights, self.all_done)
                mine = [found.reward * n, *(found.per_function[k] * n for k in names)]
            self._idle_answers(most - batches)
        total, count, *per = all_reduce_sum(mine[0], n, *mine[1:])
        if not count:
            return {"val_reward": None}
        return {"val_reward": total / count,
                **{f"val_reward_{k}": v / count for k, v in zip(names, per)}}

    def _most_batches(self, mine: int) -> int:
        """A sharded model: the most batches of greedy answers a worker draws (this one
        ``mine``)."""
        return int(all_reduce_max(mine)[0]) if self.trainee.sharded else mine

    def _idle_answers(self, count: int) -> None:
        """``count`` batches of one greedy answer to this worker's first training prompt,
        unscored: a sharded model's worker with fewer held-out prompts runs as many batches as
        the others."""
        idle = self._placed_prompt(self.data.train[0])
        for _ in range(count):
            answer(self.trainee.model, idle.ids, Draw(0, 0, idle.index), self.spec.grpo,
                   self.scoring.end_ids, greedy=True, all_done=self.all_done)


def _spans(count: int, size: int) -> list[slice]:
    """``count`` rows as slices of at most ``size``."""
    return [slice(start, min(start + size, count)) for start in range(0, count, size)]


def rollout_columns(s: dict, names: list[str], world: int, updates: int) -> dict:
    """The rollouts' columns of an interval's sums ``s`` (over every worker); ``updates``: the
    optimizer updates a step (grpo.num_iterations), which the clip and KL sums count over."""
    scored = max(s["scored"], 1)
    mean = s["reward_sum"] / scored
    variance = (s["reward_sq"] - s["reward_sum"] * mean) / max(s["scored"] - 1, 1)
    answer_tokens = max(s["answer_tokens"], 1)
    updated = answer_tokens * updates  # the tokens every update read
    return {
        "reward_mean": mean,
        "reward_std": math.sqrt(max(variance, 0.0)),
        **{f"reward_{k}": s[f"fn_sum_{k}"] / max(s[f"fn_n_{k}"], 1) for k in names},
        "frac_reward_zero_std": s["zero_std"] / max(s["groups"], 1),
        "completion_len_mean": s["answer_tokens"] / max(s["answers"], 1),
        # TRL's clip_ratio/region_mean, low_mean and high_mean, over every update
        "clip_ratio": (s["clipped_low"] + s["clipped_high"]) / updated,
        "clip_ratio_low": s["clipped_low"] / updated,
        "clip_ratio_high": s["clipped_high"] / updated,
        "kl": s["kl_sum"] / updated,
        "reward_failures": int(s["reward_failures"]),
        # each worker's seconds summed: tokens over all workers' seconds, times the workers
        "gen_tokens_per_s": s["answer_tokens"] * world / max(s["gen_s"], 1e-9),
        "train_tokens_per_s": (s["answer_tokens"] + s["prompt_tokens"]) * world
        / max(s["train_s"], 1e-9),
    }
