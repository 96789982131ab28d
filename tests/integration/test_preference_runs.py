"""Preference tuning end to end on the real engines: ``+experiment=dpo`` on the built-in sample
pairs (a line of a play: which play; the play chosen, the speaker rejected) through the Spark ETL,
the hand-off and Ray Train's DDP workers: held-out reward accuracy well above chance, the DPO
metrics in metrics.csv and summary.json, the model exported with its chat template and its
reference; ``evaluate`` on preference pairs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import commands
from helpers.configs import NO_CHECK, make_config
from raydp_llm.checkpoint.model_dir import load_model_dir
from raydp_llm.cli.evaluate import run as evaluate
from raydp_llm.cli.train import run as train
from raydp_llm.core.dpo_config import DPO_FIGURES
from raydp_llm.core.errors import InputError
from raydp_llm.data.chat.template import model_template
from raydp_llm.data.inputs.files import sample_corpus
from raydp_llm.data.preference.sample import pairs as sample_pairs
from raydp_llm.training.driver.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # an end-to-end run


@pytest.fixture(scope="module")
def dpo_run(ray_cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("dpo_run") / "run"
    summary = commands.train(out, "+experiment=dpo", "train.max_steps=60",  # as a user runs it
                             "train.eval_interval=30", "train.eval_batches=8",
                             "sample.max_new_tokens=5")
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
    left = {"unit": "pairs", "read": chat["pairs"] + chat["identical"], "kept": chat["pairs"],
            "left_out": {"identical": chat["identical"]}}
    assert summary["left_out"] == chat["left_out"] == left  # the run says what it left out
    console = out.with_name("run.console").read_text()
    assert (f"left out {chat['identical']} of {left['read']} pairs: {chat['identical']} whose "
            "two answers are the same (give each row two different answers)") in console


def test_a_run_that_would_leave_out_most_pairs_stops_with_one_line(ray_cluster, tmp_path):
    """A window too short for most sides: the ETL counts what it would drop, manifest.json says
    it, and the run stops before training with one line naming the settings that keep them."""
    out = tmp_path / "run"
    with pytest.raises(InputError, match=r"^data: the run would leave out \d+ of \d+ pairs "
                                         r"\(\d+%, more than data.max_dropped=0.2\): \d+ longer "
                                         r"than model.block_size \+ 1 = 17 tokens \(raise "
                                         r"model.block_size, or set data.overlong=truncate\);"):
        train(make_config("+experiment=dpo", "model.block_size=16", NO_CHECK), out)
    left = json.loads((out / "manifest.json").read_text())["chat"]["left_out"]
    assert left["left_out"]["dropped"] > 0.2 * left["read"] and not (out / "metrics.csv").exists()


def test_the_tuned_model_is_exported_with_its_template(dpo_run):
    model_dir = dpo_run["out"] / "model"
    assert model_template(model_dir).end_of_turn() == "<|im_end|>"
    model, _ = load_model_dir(model_dir)
    assert model.num_params() == dpo_run["summary"]["num_params"]


@pytest.fixture(scope="module")
def few_pairs(tmp_path_factory) -> Path:
    """The first 200 of the sample pairs, in a file of their own."""
    rows = sample_pairs([Path(p) for p in sample_corpus().files])[:200]
    path = tmp_path_factory.mktemp("few_pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def evaluate_pairs(model_dir: Path, pairs: Path, out: Path, *extra: str) -> dict:
    out.mkdir()  # as Hydra makes it
    return evaluate(make_config(f"model_dir={model_dir}", "data.format=preference",
                                f"data.path={pairs}", *extra, config_name="evaluate"), out)


def test_evaluate_scores_pairs_against_the_recorded_reference(dpo_run, few_pairs, tmp_path,
                                                               capsys):
    """The tuned model against the reference its directory records (the starting weights, rebuilt
    from the run's seed into model/reference/): the preference learned; against itself: ln 2 and
    no reward, exactly."""
    model_dir = dpo_run["out"] / "model"
    record = json.loads((model_dir / "preference.json").read_text())
    assert record == {"reference": "reference", "beta": 0.1, "loss": "sigmoid",
                      "label_smoothing": 0.0, "disable_dropout": True}
    tuned = evaluate_pairs(model_dir, few_pairs, tmp_path / "tuned")
    shown = capsys.readouterr().out
    assert f"\nloss {tuned['loss']:.4f}\nreward_accuracy {tuned['reward_accuracy']:.4f}\n" in shown
    assert tuned["reference"] == str(model_dir / "reference") and tuned["pairs"] > 150
    assert tuned["reward_accuracy"] > 0.9 and tuned["loss"] < 0.5 * math.log(2)
    assert json.loads((tmp_path / "tuned" / "evaluation.json").read_text()) == tuned
    itself = evaluate_pairs(model_dir, few_pairs, tmp_path / "itself", f"ref_model_dir={model_dir}",
                            "dpo.beta=0.5")
    assert itself["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert itself["reward_accuracy"] == 0 and itself["chosen_reward"] == 0
    assert itself["dpo"]["beta"] == 0.5  # given on the command line: not the recorded 0.1
    assert itself["chosen_logp"] == pytest.approx(tuned["chosen_logp"])


def test_a_transformers_model_tuned_with_lora_records_its_base_as_reference(
        ray_cluster, hf_families, few_pairs, tmp_path):
    """model=hf with LoRA (the Llama family, ChatML): the reference during training is the base
    with its adapters off, so the record names the base's directory; evaluate loads it and finds
    the tuned model's rewards against it."""
    base = hf_families["llama"]
    out = tmp_path / "run"
    summary = train(make_config(
        "+experiment=dpo", "model=hf", f"model.path={base}", "model.lora.r=4",
        "model.lora.alpha=32", "data.chat_template=chatml", f"data.path={few_pairs}",
        "model.block_size=128", "train.batch_size=8", "train.max_steps=8", "train.eval_interval=4",
        "train.eval_batches=null", "optim.lr=3e-3", "sample.max_new_tokens=5", NO_CHECK), out)
    record = json.loads((out / "model" / "preference.json").read_text())
    assert record["reference"] == str(base) and not (out / "model" / "reference").exists()
    assert (out / "model" / "adapter").is_dir()  # the adapter, beside the merged model
    assert [r["step"] for r in read_metrics(out / "metrics.csv")] == [4, 8]
    assert math.isfinite(summary["final_val_loss"]) and summary["status"] == "finished"
    scored = evaluate_pairs(out / "model", few_pairs, tmp_path / "evaluated")
    assert scored["reference"] == str(base) and scored["pairs"] > 150
    assert scored["chosen_reward"] != 0 and math.isfinite(scored["loss"])
