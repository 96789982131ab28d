"""Runs of transformers' families on the real engines: a model=hf run fine-tunes a tiny Llama with
2 DDP workers, its model/ loads with from_pretrained, the run resumes exactly, 2 FSDP workers that
load it shard by shard follow its curve, and evaluate scores a directory trained elsewhere. LoRA on
2 FSDP workers: Ray Train gathers both workers' shards into one sealed checkpoint, which a 1-worker
run continues; model/ is the merged model beside its adapter; its task scores while training are
evaluate's on model/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import commands
from helpers.configs import CACHE_DIR, NO_CHECK, make_config
from helpers.etl import every_token_scores, stream_of
from helpers.tasks import write_tasks
from raydp_llm.cli.evaluate import run as evaluate
from raydp_llm.cli.train import run as train
from raydp_llm.core.errors import InputError
from raydp_llm.training.driver.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end-to-end runs

RUN = ["model=hf", "model.block_size=32", "train.batch_size=8", "train.max_steps=8",
       "train.eval_interval=4", "train.checkpoint_interval=4", "train.eval_batches=null",
       "sample.max_new_tokens=20", f"data.cache_dir={CACHE_DIR}", NO_CHECK]


@pytest.fixture(scope="module")
def fine_tuned(ray_cluster, hf_files, hf_families, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("hf_run")
    overrides = [*RUN, f"model.path={hf_families['llama']}", f"data.path={hf_files}"]
    summary = train(make_config(*overrides), out / "run")
    return {"out": out, "summary": summary, "overrides": overrides}


def test_a_fine_tuned_model_is_a_hugging_face_directory(fine_tuned, hf_families):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = fine_tuned["out"] / "run"
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [4, 8] and rows[-1]["val_loss"] < rows[0]["val_loss"]
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    start = AutoModelForCausalLM.from_pretrained(hf_families["llama"])
    x = torch.tensor([tokenizer("ROMEO: what light", add_special_tokens=False).input_ids])
    assert not torch.allclose(model(input_ids=x).logits, start(input_ids=x).logits, atol=1e-3)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(hf_families["llama"]).get_vocab()
    assert (run_dir / "samples.txt").read_text().strip()


def test_an_hf_run_resumes_exactly(fine_tuned, tmp_path):
    first = fine_tuned["out"] / "run"
    (checkpoint,) = [p.parent for p in first.glob("ray_results/*/checkpoint_*/train_state.json")
                     if json.loads(p.read_text())["step"] == 4]
    summary = train(make_config(*fine_tuned["overrides"], f"train.resume={checkpoint}"),
                    tmp_path / "resumed")
    assert summary["resumed_from"]
    (resumed,) = read_metrics(tmp_path / "resumed" / "metrics.csv")
    whole = read_metrics(first / "metrics.csv")[-1]
    assert resumed["step"] == 8
    assert resumed["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-4)
    assert resumed["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-4)


def test_fsdp_workers_load_the_checkpoint_shard_by_shard_and_follow_ddps_curve(fine_tuned,
                                                                             tmp_path):
    """The same run on 2 FSDP workers, each loading only its shard of the weights
    (training/worker/sharded_start.py): the DDP run's curve, the data read from the ETL cache."""
    summary = train(make_config(*fine_tuned["overrides"], "train.strategy=fsdp"),
                    tmp_path / "fsdp")
    assert summary["status"] == "finished" and summary["etl"]["cache_hit"] is True
    rows = read_metrics(tmp_path / "fsdp" / "metrics.csv")
    ddp = read_metrics(fine_tuned["out"] / "run" / "metrics.csv")
    assert [r["step"] for r in rows] == [r["step"] for r in ddp] == [4, 8]
    for mine, theirs in zip(rows, ddp):
        assert abs(mine["val_loss"] - theirs["val_loss"]) < 2e-3, (mine, theirs)


def test_evaluate_scores_a_directory_trained_elsewhere(ray_cluster, hf_files, hf_families,
                                                       tmp_path):
    """Every token of both splits predicted once, in windows of the given ``model.block_size``."""
    from transformers import AutoModelForCausalLM

    directory, block = hf_families["mistral"], 48  # its positions: 128
    cfg = make_config(f"model_dir={directory}", f"data.path={hf_files}", "eval_batch_size=16",
                      f"model.block_size={block}", config_name="evaluate")
    result = evaluate(cfg, tmp_path, window=block)
    m = result["etl"]
    ids = stream_of(Path(result["dataset"]), m["token_dtype"])
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    direct = every_token_scores(lambda x: model(input_ids=x).logits, ids,
                                [(0, m["tokens_train"]), (m["tokens_train"], m["tokens"])], block)
    assert m["block_size"] == block and result["tokens"] == direct["tokens"] == m["tokens"] - 2
    assert result["loss"] == pytest.approx(direct["loss"], rel=1e-5)
    with pytest.raises(InputError, match=r"^model.block_size=129: .* reads at most 128 tokens"):
        evaluate(cfg, tmp_path, window=129)


def test_evaluate_takes_the_trained_window_and_scores_a_text_shorter_than_it(fine_tuned,
                                                                             hf_families,
                                                                             tmp_path):
    """A model fine-tuned with ``model.block_size=32`` (its positions: 128) on a held-out text of
    fewer tokens than one window: windows of 32 tokens, every token but each split's first
    scored."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = fine_tuned["out"] / "run" / "model"
    text = tmp_path / "held_out.txt"
    text.write_text("ROMEO: what light")
    tokens = len(AutoTokenizer.from_pretrained(model_dir)(text.read_text()).input_ids)
    assert tokens < 32
    result = evaluate(make_config(f"model_dir={model_dir}", f"data.path={text}",
                                  f"data.cache_dir={CACHE_DIR}", config_name="evaluate"),
                      tmp_path / "evaluate")
    m = result["etl"]
    # a short window per split that has a token to predict
    assert m["block_size"] == 32 and result["windows"] == 1 + (m["tokens_val"] >= 2)
    ids = stream_of(Path(result["dataset"]), m["token_dtype"])
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    direct = every_token_scores(lambda x: model(input_ids=x).logits, ids,
                                [(0, m["tokens_train"]), (m["tokens_train"], m["tokens"])], 32)
    assert result["tokens"] == direct["tokens"] == m["tokens"] - 2
    assert result["loss"] == pytest.approx(direct["loss"], rel=1e-5)


@pytest.fixture(scope="module")
def lora_on_fsdp(ray_cluster, hf_files, hf_families, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("lora_fsdp")
    overrides = [*RUN, f"model.path={hf_families['llama']}", f"data.path={hf_files}",
                 "train.strategy=fsdp", "model.lora.r=4", "model.lora.alpha=32"]
    tasks = write_tasks(out)  # scored at both checkpoints: the shards gathered, the LoRA merged
    # as a user runs it (a fresh process, torch never seeded): LoRA's export once failed there
    summary = commands.train(out / "run", *overrides, f"train.eval_tasks=[{tasks['mc']}]")
    return {"out": out, "summary": summary, "overrides": overrides, "tasks": tasks}


def test_lora_on_fsdp_workers_exports_the_merged_model_and_its_adapter(lora_on_fsdp, hf_families):
    from transformers import AutoModelForCausalLM

    run_dir, summary = lora_on_fsdp["out"] / "run", lora_on_fsdp["summary"]
    rows = read_metrics(run_dir / "metrics.csv")
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]
    assert 0 < summary["trainable_params"] < summary["num_params"] / 5
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "model")  # no peft needed
    assert not any("lora" in name for name, _ in merged.named_parameters())
    adapter = json.loads((run_dir / "model" / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 32
    start = AutoModelForCausalLM.from_pretrained(hf_families["llama"])
    x = torch.arange(16)[None]
    assert not torch.allclose(merged(input_ids=x).logits, start(input_ids=x).logits, atol=1e-4)


def test_tasks_scored_on_a_lora_fsdp_run_equal_evaluate_on_its_model(lora_on_fsdp, tmp_path):
    """``train.eval_tasks`` on sharded LoRA checkpoints: the score at the last one is what
    evaluate gives on the run's model/ (its merged export) afterwards."""
    run_dir, mc = lora_on_fsdp["out"] / "run", lora_on_fsdp["tasks"]["mc"]
    rows = {r["step"]: r for r in read_metrics(run_dir / "metrics.csv")}
    assert rows[4]["task_tiny_mc_acc"] is not None
    after = evaluate(make_config(f"model_dir={run_dir / 'model'}", f"tasks=[{mc}]",
                                 config_name="evaluate"), tmp_path / "after")
    assert rows[8]["task_tiny_mc_acc"] == pytest.approx(after["tasks"]["tiny_mc"]["acc"],
                                                        abs=1e-9)


def test_a_sharded_checkpoint_of_two_workers_continues_on_one(lora_on_fsdp, tmp_path):
    """Ray Train put both workers' shards in one checkpoint, sealed by rank 0's complete.json; a
    1-worker run resumes it and ends where the 2-worker run did."""
    first = lora_on_fsdp["out"] / "run"
    (checkpoint,) = [p.parent for p in first.glob("ray_results/*/checkpoint_*/train_state.json")
                     if json.loads(p.read_text())["step"] == 4]
    listed = json.loads((checkpoint / "complete.json").read_text())["files"]
    assert {"shards/__0_0.distcp", "shards/__1_0.distcp", "shards/.metadata"} <= listed.keys()
    summary = train(make_config(*lora_on_fsdp["overrides"], f"train.resume={checkpoint}",
                                "train.num_workers=1"), tmp_path / "resumed")
    assert summary["resumed_from"]
    (resumed,) = read_metrics(tmp_path / "resumed" / "metrics.csv")
    whole = read_metrics(first / "metrics.csv")[-1]
    assert resumed["step"] == 8 and resumed["workers"] == 1
    assert abs(resumed["val_loss"] - whole["val_loss"]) < 2e-3
    assert abs(resumed["train_loss"] - whole["train_loss"]) < 2e-3
