"""GRPO's arithmetic against hand-computed tensors (advantages, the clipped surrogate of each
loss_type, the KL term), and the reward functions: found and checked by their spec, called in
their own process, a hanging and a raising one failing their batch, never the caller."""

from __future__ import annotations

import math
import re
import textwrap
import time

import pytest
import torch

from raydp_llm.core.errors import InputError
from raydp_llm.core.grpo_config import GrpoSettings
from raydp_llm.training.objectives.grpo_loss import (
    STD_FLOOR,
    Whole,
    advantages,
    combined_rewards,
    policy_loss,
)
from raydp_llm.training.objectives.rewards import (
    SHIPPED,
    FailureStreak,
    Reward,
    RewardCalls,
    Scores,
    load,
)

NAN = float("nan")


def test_advantages_are_relative_to_the_group_scaled_as_asked():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # two prompts, 4 answers each
    group_std = math.sqrt(1 / 3)  # of 1, 0, 0, 1 (Bessel)
    batch_std = math.sqrt(5.5 / 7)  # of all eight: mean 1.25, squares summing to 5.5
    centred = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0])

    group = advantages(rewards, 4, "group")
    std = torch.tensor([group_std] * 4 + [0.0] * 4)
    assert torch.allclose(group.values, centred / (std + STD_FLOOR))
    assert group.zero_std.tolist() == [False] * 4 + [True] * 4  # the second group: no signal
    assert torch.allclose(advantages(rewards, 4, "batch").values, centred / (batch_std + STD_FLOOR))
    assert torch.equal(advantages(rewards, 4, "none").values, centred)


def test_an_unscored_answer_has_no_advantage_and_leaves_its_groups_baseline():
    rewards = torch.tensor([1.0, NAN, 0.0, 1.0])
    values = advantages(rewards, 4, "none").values
    assert torch.allclose(values, torch.tensor([1 / 3, 0.0, -2 / 3, 1 / 3]))  # mean of 1, 0, 1
    per_function = torch.tensor([[1.0, NAN], [NAN, NAN], [0.5, 2.0]])
    total = combined_rewards(per_function, torch.tensor([1.0, 0.5]))
    assert total[0] == 1.0 and total[1].isnan() and total[2] == 1.5


# Two answers of up to 3 tokens: ratios exp(logp - old) of [1.5, 0.9, -] and [0.5, 1.1, 1.0],
# advantages +1 and -1. With epsilon 0.2 the first token of each is clipped (1.5 > 1.2 with a
# positive advantage, 0.5 < 0.8 with a negative one): per-token losses [-1.2, -0.9] and
# [0.8, 1.1, 1.0]; sums -2.1 over 2 tokens and 2.9 over 3.
RATIOS = torch.tensor([[1.5, 0.9, 1.0], [0.5, 1.1, 1.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
ADVANTAGE = torch.tensor([1.0, -1.0])


def _loss(grpo: GrpoSettings, whole=Whole(answers=2, tokens=5), rows=slice(None), ref=None):
    old = torch.zeros(2, 3)
    logps = RATIOS.log().clone().requires_grad_(True)
    loss = policy_loss(logps[rows], old[rows], ADVANTAGE[rows], MASK[rows], grpo, whole,
                       None if ref is None else ref[rows])
    return loss, logps


@pytest.mark.parametrize("loss_type, expected", [
    ("dapo", (-2.1 + 2.9) / 5),  # every answer token of the batch alike
    ("grpo", (-2.1 / 2 + 2.9 / 3) / 2),  # each answer's mean, then the mean over answers
    ("dr_grpo", (-2.1 + 2.9) / (2 * 4)),  # over answers × grpo.max_new_tokens
])
def test_each_loss_type_is_trls_and_the_workers_shares_sum_to_it(loss_type, expected):
    grpo = GrpoSettings(loss_type=loss_type, max_new_tokens=4)
    loss, _ = _loss(grpo)
    assert loss.share.item() == pytest.approx(expected)
    assert (loss.clipped_low, loss.clipped_high) == (1, 1)  # 0.5 < 0.8 (A < 0); 1.5 > 1.2 (A > 0)
    halves = [_loss(grpo, rows=slice(i, i + 1))[0].share.item() for i in (0, 1)]
    assert sum(halves) == pytest.approx(expected)  # two workers, one answer each


def test_a_clipped_token_gets_no_gradient_and_clip_higher_lets_it_through():
    loss, logps = _loss(GrpoSettings(loss_type="dapo"))
    loss.share.backward()
    # d/dlogp of -A·r/5 where unclipped: -A·r/5; clipped and masked tokens: 0
    expected = torch.tensor([[0.0, -0.9 / 5, 0.0], [0.0, 1.1 / 5, 1.0 / 5]])
    assert torch.allclose(logps.grad, expected)
    wider, _ = _loss(GrpoSettings(loss_type="dapo", epsilon_high=0.6))
    assert wider.share.item() == pytest.approx((-1.5 - 0.9 + 2.9) / 5)
    assert (wider.clipped_low, wider.clipped_high) == (1, 0)


def test_the_kl_to_the_reference_is_k3_weighted_by_beta():
    ref = RATIOS.log().clone()
    ref[1, 2] += math.log(2)  # one token twice as likely under the reference
    k3 = 2 - math.log(2) - 1
    loss, _ = _loss(GrpoSettings(loss_type="dapo", beta=0.1), ref=ref)
    assert loss.kl_sum.item() == pytest.approx(k3)
    assert loss.share.item() == pytest.approx((0.8 + 0.1 * k3) / 5)


def test_the_shipped_rewards():
    completions = ["The sum is 1,234.", "no number", "<think>a</think> <answer>7</answer>"]
    answers = ["#### 1234", "5", "7"]
    assert SHIPPED["last_number"]([""] * 3, completions, answer=answers) == [1.0, 0.0, 1.0]
    assert SHIPPED["exact_match"]([""] * 2, [" 5 ", "6"], answer=["5", 5]) == [1.0, 0.0]
    assert SHIPPED["tagged_format"]([""] * 3, completions) == [0.0, 0.0, 1.0]


REWARDS = textwrap.dedent("""
    import time

    def length(prompts, completions, **columns):
        return [float(len(c)) for c in completions]

    def against(prompts, completions, answer, source=None):
        return [float(c == a) for c, a in zip(completions, answer)]

    def hangs(prompts, completions, **columns):
        time.sleep(600)

    def raises(prompts, completions, **columns):
        raise ValueError("no score for this batch")

    def dies(prompts, completions, **columns):
        import os
        os._exit(3)

    def short(prompts, completions, **columns):
        return [1.0]

    def unlike_trl(text):
        return [1.0]
""")


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def test_a_reward_is_found_by_its_spec_and_its_columns_checked(reward_file):
    loaded = load([f"{reward_file}:against", "last_number"], {"answer", "source"})
    assert [r.name for r in loaded] == ["against", "last_number"]
    bad = {
        f"{reward_file}:nothing": f"{reward_file} has no function 'nothing'",
        f"{reward_file.parent}/absent.py:f": "absent.py does not exist",
        "no_such_module_here:f": "the module no_such_module_here cannot be imported",
        "just_a_name": "names no function",
        f"{reward_file}:unlike_trl": "must take (prompts, completions, **columns); it takes (text)",
        f"{reward_file}:against ": "has no function 'against '",
    }
    for spec, message in bad.items():
        with pytest.raises(InputError, match="grpo.rewards: .*" + re.escape(message)):
            load([spec], {"answer"})
    with pytest.raises(InputError, match="asks for the column 'answer', which the data lacks"):
        load([f"{reward_file}:against"], {"source"})
    with pytest.raises(InputError, match="grpo.rewards is empty"):
        load([], set())


def test_a_hanging_or_raising_reward_fails_its_batch_and_the_next_call_still_scores(reward_file):
    calls = RewardCalls(timeout_s=3)
    try:
        texts = ["a", "bcd"]
        good = calls.score(f"{reward_file}:length", ["p", "p"], texts, {"answer": ["x", "y"]})
        assert good.values == [1.0, 3.0] and good.error is None
        began = time.monotonic()
        hung = calls.score(f"{reward_file}:hangs", ["p", "p"], texts, {})
        assert hung.values == [None, None] and "no answer within 3s" in hung.error
        assert time.monotonic() - began < 10
        raised = calls.score(f"{reward_file}:raises", ["p", "p"], texts, {})
        assert raised.values == [None, None] and "ValueError: no score" in raised.error
        died = calls.score(f"{reward_file}:dies", ["p", "p"], texts, {})
        assert died.values == [None, None] and "process ended" in died.error
        short = calls.score(f"{reward_file}:short", ["p", "p"], texts, {})
        assert "returned 1 scores for 2 completions" in short.error
        again = calls.score(f"{reward_file}:against", ["p", "p"], texts,
                            {"answer": ["a", "b"], "other": [1, 2]})
        assert again.values == [1.0, 0.0]  # the columns it does not take are left out
    finally:
        calls.close()


def test_the_rewards_process_start_is_not_counted_in_a_calls_time(tmp_path):
    """A reward whose import takes 2 s scores its batch within a 1 s limit, the first time and
    after a hang restarted the process (CI once failed a fast reward's batches as hung: its
    process's start, on a busy machine, took the whole limit)."""
    (tmp_path / "slow_import.py").write_text(
        "import time\ntime.sleep(2)\n\n\ndef one(prompts, completions, **_):\n"
        "    return [1.0] * len(completions)\n\n\ndef hangs(prompts, completions, **_):\n"
        "    time.sleep(60)\n")
    spec = f"{tmp_path / 'slow_import.py'}:one"
    calls = RewardCalls(timeout_s=1, specs=(spec,))
    try:
        assert calls.score(spec, ["p"], ["a"], {}).values == [1.0]
        hung = calls.score(f"{tmp_path / 'slow_import.py'}:hangs", ["p"], ["a"], {})
        assert "no answer within 1s" in hung.error
        assert calls.score(spec, ["p"], ["a"], {}) == Scores([1.0])
    finally:
        calls.close()


def test_a_reward_failing_every_batch_for_too_many_steps_stops_the_run():
    streak = FailureStreak([Reward("f.py:r", "r"), Reward("g", "g")], limit=2)
    streak.step({"f.py:r": "TimeoutError", "g": None})
    streak.step({"f.py:r": None, "g": None})  # a step it scored: the count starts again
    streak.step({"f.py:r": "TimeoutError", "g": None})
    with pytest.raises(InputError, match=r"f.py:r failed on every batch of 2 steps in a row"):
        streak.step({"f.py:r": "TimeoutError", "g": None})


SEVENS = textwrap.dedent("""
    def sevens(prompts, completions, **columns):
        return [c.split().count("7") / max(len(c.split()), 1) for c in completions]
""")


def test_the_reward_rises_on_a_toy_task(tmp_path):
    """GRPO steps of one worker on a tiny GPT, rewarded for the share of token 7 in its answers:
    rollouts, the user's reward in its own process, advantages, the dapo loss, AdamW."""
    from raydp_llm.core.model_config import GPTConfig
    from raydp_llm.models.factory import build_model
    from raydp_llm.training.objectives.grpo_loss import answer_batch, answer_logps
    from raydp_llm.training.objectives.rollout import Draw, PromptRow, Scoring, evaluate, roll_out

    (tmp_path / "toy.py").write_text(SEVENS)
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=10, block_size=16, n_layer=1, n_head=2, n_embd=16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    grpo = GrpoSettings(num_generations=8, max_new_tokens=6)
    prompts = [PromptRow(i, torch.tensor(ids), "", {}) for i, ids in enumerate([[1, 2], [3, 4]])]
    calls = RewardCalls(timeout_s=30)
    scoring = Scoring(lambda ids: " ".join(map(str, ids)), (), calls,
                      load([f"{tmp_path / 'toy.py'}:sevens"], set()))
    means = []
    try:
        for step in range(25):
            groups = roll_out(model.eval(), prompts, [Draw(1, step, p.index) for p in prompts],
                              grpo, scoring)
            whole = Whole(answers=16, tokens=int(sum(g.answers.mask.sum() for g in groups)))
            model.train()
            optimizer.zero_grad()
            for group in groups:
                rewards = group.per_function[:, 0]
                advantage = advantages(rewards, grpo.num_generations, "group").values
                batch = answer_batch([group.prompt.ids], [group.answers.ids],
                                     [group.answers.mask], [advantage])
                logps = answer_logps(model, batch, grpo.temperature)
                policy_loss(logps, logps.detach(), batch.advantages, batch.mask, grpo,
                            whole).share.backward()
            optimizer.step()
            means.append(float(torch.cat([g.per_function[:, 0] for g in groups]).mean()))
        held_out = [PromptRow(7, torch.tensor([5, 6]), "", {})]
        greedy = evaluate(model.eval(), held_out, grpo, scoring, torch.tensor([1.0]))
    finally:
        calls.close()
    assert sum(means[:5]) / 5 < 0.2 and sum(means[-5:]) / 5 > 0.5, means
    # the evaluation: one greedy answer per held-out prompt, its reward the share of 7s in it
    (text,) = greedy.answers
    assert greedy.reward == pytest.approx(text.split().count("7") / len(text.split()))
    assert greedy.per_function == {"sevens": pytest.approx(greedy.reward)} and greedy.reward > 0.5


def test_the_grpo_settings_refuse_what_grpo_cannot_run_with_one_line():
    from dataclasses import replace

    from raydp_llm.core.schema import check_fields

    check_fields(GrpoSettings(), "grpo.")  # the defaults pass
    refused = {
        "num_generations": (1, "a whole number ≥ 2"),  # one answer has no group to be relative to
        "loss_type": ("ppo", "grpo | dr_grpo | dapo"),
        "scale_rewards": ("median", "group | batch | none"),
        "top_p": (0, "a number in (0, 1]"),
        "beta": (-0.1, "a number ≥ 0"),
    }
    for key, (value, allowed) in refused.items():
        with pytest.raises(InputError, match=re.escape(f"grpo.{key}={value} is not allowed: use "
                                                       f"{allowed}")):
            check_fields(replace(GrpoSettings(), **{key: value}), "grpo.")


def _grpo_worker(tmp_path, lora: bool, **settings):
    """A GRPO worker (plain torch, one process) on a tiny Llama, grpo.beta=0.1, rewarded by the
    share of the answer's letters that are vowels."""
    from helpers.grpo_task import REWARDS, LocalPrompts
    from helpers.hf_models import CHAT_TEXTS, build
    from helpers.tiny_loop import CPU
    from raydp_llm.core.config import HFConfig, OptimSettings, TrainSettings
    from raydp_llm.core.model_config import LoraSettings
    from raydp_llm.core.tokenizer import load_tokenizer
    from raydp_llm.training.spec import TrainSpec
    from raydp_llm.training.worker.worker import Worker

    directory = build("llama", tmp_path / "llama", CHAT_TEXTS)
    (tmp_path / "rewards.py").write_text(REWARDS)
    model = HFConfig(path=str(directory), block_size=32, vocab_size=None,
                     lora=LoraSettings(r=4, alpha=8.0) if lora else LoraSettings())
    grpo = GrpoSettings(num_generations=4, max_new_tokens=6, beta=0.1,
                        rewards=[f"{tmp_path / 'rewards.py'}:vowels"], **settings)
    train = TrainSettings(batch_size=2, max_steps=4, eval_interval=4, checkpoint_interval=0,
                          cpus_per_worker=1, objective="grpo", eval_batches=None, num_workers=1)
    spec = TrainSpec(model=model, optim=OptimSettings(lr=3e-2, warmup_steps=0), train=train,
                     seed=3, tokenizer_json=load_tokenizer(directory).to_json(),
                     token_dtype="int32", chars_per_token=None, sampling={},
                     steps_per_epoch=4, max_steps=4, fingerprint="g" * 20, grpo=grpo)
    prompts = [(i, [5 + i, 9, 12]) for i in range(10)]
    data = {"train": LocalPrompts(prompts[:8]), "val": LocalPrompts(prompts[8:])}
    return Worker(spec, data, CPU)


def test_with_lora_the_reference_is_the_base_with_its_adapters_off(tmp_path):
    """grpo.beta > 0 with LoRA loads no second model: the reference is the policy's own base, its
    adapters switched off; the KL to it grows from 0 as the adapters train. Without LoRA the
    reference is a frozen copy."""
    from helpers.tiny_loop import Reports
    from raydp_llm.checkpoint.layout import TrainState
    from raydp_llm.training.worker.loop import TrainLoop

    worker = _grpo_worker(tmp_path / "lora", lora=True)
    try:
        assert worker.reference is worker.model  # no copy: its adapters off
        trainable = sum(p.numel() for p in worker.model.parameters() if p.requires_grad)
        assert trainable < sum(p.numel() for p in worker.model.parameters()) / 4
        reports = Reports(tmp_path / "reports")
        assert TrainLoop(worker, TrainState(), reports).run()
    finally:
        worker.objective.calls.close()
    (row,) = reports.rows
    assert row["kl"] > 0 and row["reward_mean"] > 0 and row["val_reward"] is not None
    assert worker.model.training  # the reference's switch to eval mode was undone

    copied = _grpo_worker(tmp_path / "full", lora=False)
    copied.objective.calls.close()
    assert copied.reference is not copied.model
    assert not any(p.requires_grad for p in copied.reference.parameters())


def test_the_updates_batch_is_its_own_and_does_not_change_the_step(tmp_path):
    """grpo.update_batch_size=3 splits each group of 4 answers (3 + 1) for the log-probabilities
    and the backward, apart from generation's batch: the same answers, the same loss and the
    same weights after the steps as one batch of all (two updates a batch: the old policy's
    log-probabilities batched the same way)."""
    from helpers.tiny_loop import Reports
    from raydp_llm.checkpoint.layout import TrainState
    from raydp_llm.training.worker.loop import TrainLoop

    runs = {}
    for name, size in (("whole", None), ("split", 3)):
        worker = _grpo_worker(tmp_path / name, lora=False, update_batch_size=size,
                              num_iterations=2)
        try:
            reports = Reports(tmp_path / f"{name}_reports")
            assert TrainLoop(worker, TrainState(), reports).run()
        finally:
            worker.objective.calls.close()
        runs[name] = (reports.rows[-1], [p.detach().clone() for p in worker.model.parameters()])
    (whole, whole_weights), (split, split_weights) = runs["whole"], runs["split"]
    assert split["reward_mean"] == whole["reward_mean"]  # the same answers drawn
    assert split["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-5, abs=1e-7)
    for a, b in zip(split_weights, whole_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # Adam, 4 steps: float noise
