"""Learning from rewards end to end, as a user runs it (``python -m raydp_llm.train`` in a fresh
process): prompts from a JSON Lines file through the Spark ETL, 2 DDP workers answering them with a
tiny Llama, the user's reward functions in a file of their own (helpers/grpo_task.py). The reward
rises; a hanging and a raising reward cost their batches, never the step; a reward failing on
every batch stops the run with one line; a SIGKILLed run resumed on 1 worker draws the undisturbed
run's answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import commands
from helpers.grpo_task import overrides, write_task
from helpers.processes import kill_tree
from helpers.terminal import wait_for
from raydp_llm.data.prompts.dataset import in_validation
from raydp_llm.training.driver.metrics import read_metrics

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict[str, Path]:
    return write_task(tmp_path_factory.mktemp("grpo_task"))


@pytest.fixture(scope="module")
def rising(task, tmp_path_factory) -> dict:
    """30 steps on 2 workers, rewarded by ``vowels`` and ``flaky`` (which hangs on one prompt and
    raises on another), an evaluation every 10."""
    out = tmp_path_factory.mktemp("grpo_rising") / "run"
    summary = commands.train(out, *overrides(task, "vowels", "flaky"), "grpo.reward_timeout_s=2",
                             "train.max_steps=30", "train.eval_interval=10")
    return {"out": out, "summary": summary, "rows": read_metrics(out / "metrics.csv")}


@pytest.mark.slow  # an end-to-end run (``rising``: 90 s here, a seventh of make test-fast)
def test_the_reward_rises_on_two_workers(rising):
    rows, summary = rising["rows"], rising["summary"]
    assert [r["step"] for r in rows] == [10, 20, 30]
    assert rows[-1]["reward_mean"] > rows[0]["reward_mean"] + 0.1  # ~0.24 → ~0.43, measured
    assert summary["final_val_reward"] == rows[-1]["val_reward"]
    assert summary["final_reward_mean"] == rows[-1]["reward_mean"]
    last = rows[-1]
    assert last["reward_vowels"] == pytest.approx(last["reward_mean"])  # flaky adds 0
    assert last["val_reward_vowels"] == pytest.approx(last["val_reward"])
    assert 0 <= last["frac_reward_zero_std"] <= 1 and 0 < last["completion_len_mean"] <= 16
    assert last["clip_ratio"] == 0  # one update per batch: the ratio is 1
    assert last["kl"] == 0  # grpo.beta=0: no reference
    assert last["gen_tokens_per_s"] > 0 and last["train_tokens_per_s"] > 0
    assert last["workers"] == 2
    assert not {"val_loss", "val_ppl", "train_acc", "val_acc", "mfu"} & set(last)  # lm's only
    assert 0 <= last["clip_ratio_low"] <= last["clip_ratio"]
    assert summary["etl"]["cache_hit"] is False and summary["spark_start_s"] > 0
    manifest = json.loads((rising["out"] / "manifest.json").read_text())
    assert manifest["prompts"]["train"] + manifest["prompts"]["val"] == 120
    assert manifest["left_out"] == {"unit": "prompts", "read": 120, "kept": 120, "left_out": {}}
    samples = (rising["out"] / "samples.txt").read_text()
    assert samples.count("prompt: ") == 4 and samples.count("answer: ") == 4
    console = rising["out"].with_name("run.console").read_text()
    assert re.search(r"step 30/30 \| reward \d\.\d{4} ± \d\.\d{4} \| val reward \d\.\d{4}",
                     console)
    assert re.search(r"val reward \d\.\d{4} → \d\.\d{4}", console)
    # the live bar: the step's reward over both workers, then the last val reward
    assert re.search(r"reward \d\.\d{3} ± \d\.\d{3}, val reward \d\.\d{3}, [\d,]+ tok/s",
                     console) and "loss 0.000" not in console


@pytest.mark.slow  # the same end-to-end run
def test_a_hanging_or_raising_reward_costs_its_batches_not_the_step(rising):
    """``flaky`` hung on prompt 3 (ended after grpo.reward_timeout_s=2) and raised on prompt 5,
    each time they came: counted as reward failures; every step ran, its reward None there."""
    rows = rising["rows"]
    assert sum(r["reward_failures"] for r in rows) >= 2
    assert all(r["reward_flaky"] == 0 for r in rows)  # its other batches scored


@pytest.mark.slow
def test_a_reward_failing_on_every_batch_stops_the_run_with_one_line(task, tmp_path):
    out = tmp_path / "run"
    done = commands.run("raydp_llm.train", *overrides(task, "vowels", "broken"),
                        "grpo.max_reward_failures=2", "train.max_steps=10",
                        "train.eval_interval=5", f"hydra.run.dir={out}")
    errors = [line for line in (done.stdout + done.stderr).splitlines() if "error:" in line]
    assert done.returncode != 0
    assert len(errors) == 1 and re.search(
        r"the run stopped at step 2: grpo.rewards: \S+rewards.py:broken failed on every "
        r"batch of 2 steps in a row \(TypeError: broken on purpose\)", errors[0]), errors


@pytest.mark.slow
def test_a_killed_run_resumed_on_one_worker_draws_the_undisturbed_answers(task, tmp_path):
    """An evaluation every step: the resumed run's first step (1 worker, the weights of the
    2-worker checkpoint) has exactly the undisturbed run's rewards: the same prompts and the same
    answers, none skipped or repeated; later steps follow it (the gradients' sums differ in their
    last bits between 1 and 2 workers, so the answers drift apart slowly)."""
    command = [*overrides(task), "train.max_steps=13", "train.eval_interval=1",
               "train.checkpoint_interval=10", "name=grpo_resume"]
    whole = commands.train(tmp_path / "whole", *command)
    expected = {r["step"]: r for r in read_metrics(tmp_path / "whole" / "metrics.csv")}
    assert whole["steps"] == 13
    # the rising run's prompts' ETL is in the cache: no Spark started for these runs
    assert whole["etl"]["cache_hit"] is True and "spark_start_s" not in whole

    runs = tmp_path / "outputs" / "grpo_resume"
    first = commands.start("raydp_llm.train", *command, f"hydra.run.dir={runs / 'killed'}")
    wait_for(first, lambda: any(runs.glob("killed/ray_results/*/checkpoint_*/complete.json")),
             "the first checkpoint", timeout_s=300)
    kill_tree(first)
    resumed = commands.train(runs / "resumed", *command, "train.num_workers=1")
    assert resumed["resumed_from"] and "/checkpoint_" in resumed["resumed_from"]
    rows = read_metrics(runs / "resumed" / "metrics.csv")
    assert rows[0]["step"] == 11 and rows[-1]["step"] == 13 and rows[0]["workers"] == 1
    step = expected[11]
    for key in ("reward_mean", "reward_std", "completion_len_mean", "val_reward"):
        assert rows[0][key] == pytest.approx(step[key], rel=1e-6), key
    for r in rows[1:]:
        assert r["reward_mean"] == pytest.approx(expected[r["step"]]["reward_mean"], abs=0.03)


@pytest.mark.slow
def test_evaluate_answers_every_prompt_and_scores_it_as_training_did(task, rising, tmp_path):
    """``python -m raydp_llm.evaluate`` on the run's held-out prompts alone: its reward is the
    run's last val_reward (the same greedy answers), on the console and in evaluation.json."""
    rows = [json.loads(line) for line in task["prompts"].read_text().splitlines()]
    held_out = [r for r in rows if in_validation(1337, r["id"], 0.1)]  # the run's seed and split
    table = tmp_path / "held_out.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in held_out))
    out = tmp_path / "evaluation"
    done = commands.run("raydp_llm.evaluate", f"model_dir={rising['out'] / 'model'}",
                        "data.format=prompts", f"data.path={table}",
                        f"grpo.rewards=[{task['rewards']}:vowels]", "grpo.max_new_tokens=16",
                        f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["prompts"] == len(held_out) > 0
    assert evaluation["reward"] == pytest.approx(rising["rows"][-1]["val_reward"], abs=1e-6)
    assert evaluation["reward_vowels"] == pytest.approx(evaluation["reward"])
    assert f"reward {evaluation['reward']:.4f}" in done.stdout
    assert f"reward_vowels {evaluation['reward']:.4f}" in done.stdout
