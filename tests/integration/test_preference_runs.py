"""Preference tuning end to end on the real engines: ``+experiment=dpo`` on the built-in sample
pairs (a line of a play: which play; the play chosen, the speaker rejected) through the Spark ETL,
the hand-off and Ray Train's DDP workers: held-out reward accuracy well above chance, the DPO
metrics in metrics.csv and summary.json, and the model exported with its chat template."""

from __future__ import annotations

import math

import pytest

from helpers.configs import NO_CHECK, make_config
from raydp_llm.checkpoint.model_dir import load_model_dir
from raydp_llm.cli.train import run as train
from raydp_llm.data.chat import model_template
from raydp_llm.training.metrics import DPO_FIGURES, read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # an end-to-end run


@pytest.fixture(scope="module")
def dpo_run(ray_cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("dpo_run") / "run"
    summary = train(make_config("+experiment=dpo", "train.max_steps=60", "train.eval_interval=30",
                                "train.eval_batches=8", "sample.max_new_tokens=5", NO_CHECK), out)
    return {"out": out, "summary": summary}


def test_the_sample_preference_is_learned_on_held_out_pairs(dpo_run):
    summary, out = dpo_run["summary"], dpo_run["out"]
    rows = read_metrics(out / "metrics.csv")
    assert [r["step"] for r in rows] == [30, 60]
    assert summary["final_val_reward_accuracy"] > 0.9  # chance is 0.5
    assert summary["final_val_loss"] == rows[-1]["val_loss"] < 0.5 * math.log(2)
    assert summary["final_val_reward_margin"] > 0
    last = rows[-1]
    assert last["val_chosen_reward"] > last["val_rejected_reward"]
    assert all(last[f"{split}_{k}"] is not None for k in DPO_FIGURES for split in ("train", "val"))
    assert last["val_ppl"] is None and last["val_bpc"] is None
    chat = summary["etl"]["chat"]  # the manifest's counts: a title said by its own hero is
    assert chat["pairs"] > 9000 and chat["identical"] > 0  # both answers: counted, skipped
    assert 0 < chat["chosen_tokens_per_pair"] < chat["record_tokens"]
    assert 0.9 * chat["pairs"] < chat["prompts"] <= chat["pairs"]  # a few lines repeat


def test_the_tuned_model_is_exported_with_its_template(dpo_run):
    model_dir = dpo_run["out"] / "model"
    assert model_template(model_dir).end_of_turn() == "<|im_end|>"
    model, _ = load_model_dir(model_dir)
    assert model.num_params() == dpo_run["summary"]["num_params"]
