"""Benchmark tasks through lm-evaluation-harness (training/tasks.py), offline, on the own GPT
through its GPT-2 export: local task YAMLs (a multiple-choice task, a generation task with exact
match) give what ``lm_eval.simple_evaluate`` gives run directly on the same exported directory;
``train.eval_tasks`` scores a run's checkpoints as evaluate does afterwards; bad tasks are one line
each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import commands
from helpers.configs import CACHE_DIR, NO_CHECK, make_config
from helpers.s3 import BUCKET
from helpers.tasks import GEN_TASK, MC_TASK, QUESTIONS, task_rows, write_tasks
from raydp_llm.checkpoint.model_dir import load_model_dir, save_model_dir
from raydp_llm.cli.evaluate import run as evaluate
from raydp_llm.cli.train import run as train
from raydp_llm.core import storage
from raydp_llm.core.config import GPTConfig
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.models.factory import build_model
from raydp_llm.training.driver.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # lm-evaluation-harness runs

@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict:
    """A tiny GPT (untrained: the scores are the harness's arithmetic, not skill) whose characters
    cover the tasks, and the two task YAMLs over JSON Lines."""
    d = tmp_path_factory.mktemp("tasks")
    write_tasks(d)
    tokenizer = CharTokenizer("".join(json.dumps(task_rows())) + " \n")
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=1,
                                  n_head=2, n_embd=32))
    return {"dir": d, "model": save_model_dir(d / "model", model, tokenizer)}


def test_local_tasks_score_as_the_harness_run_directly(tasks, tmp_path):
    """``python -m raydp_llm.evaluate tasks=[...]`` as a user runs it (a fresh process), against
    the harness run on the same model in this one."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    d = tasks["dir"]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = commands.run("raydp_llm.evaluate", f"model_dir={tasks['model']}",
                        f"tasks=[{d / 'mc.yaml'},{d / 'gen.yaml'}]", "eval_batch_size=2",
                        "tracking=mlflow", f"tracking.uri={store}", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result, printed = json.loads((tmp_path / "evaluation.json").read_text()), done.stdout
    direct = simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'hf_model'}",
                             tasks=["tiny_mc", "tiny_gen"], batch_size=2, device="cpu",
                             task_manager=TaskManager(include_path=str(d),
                                                      include_defaults=False))["results"]
    assert result["tasks"]["tiny_mc"]["acc"] == pytest.approx(direct["tiny_mc"]["acc,none"],
                                                              abs=1e-6)
    assert result["tasks"]["tiny_gen"]["exact_match"] == pytest.approx(
        direct["tiny_gen"]["exact_match,none"], abs=1e-6)
    assert f"task tiny_mc acc {result['tasks']['tiny_mc']['acc']:.4f}" in printed
    assert result["harness"]["results"]["tiny_mc"]["sample_len"] == len(QUESTIONS)
    _assert_logged_to_mlflow(store, result, str(tasks["model"]))


def _assert_logged_to_mlflow(store: str, result: dict, model_dir: str) -> None:
    """``tracking=mlflow``: evaluate's own run holds the task scores as training's columns
    (``task_<task>_<metric>``), the settings, the model it scored and evaluation.json."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("raydp_llm").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["raydp_llm.evaluated"] == model_dir
    assert run.data.metrics["task_tiny_mc_acc"] == pytest.approx(result["tasks"]["tiny_mc"]["acc"])
    assert run.data.metrics["task_tiny_gen_exact_match"] == pytest.approx(
        result["tasks"]["tiny_gen"]["exact_match"])
    assert run.data.params["num_fewshot"] == "null" and run.data.params["eval_batch_size"] == "2"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["evaluation.json"]


def test_bad_tasks_are_one_line(tasks, tmp_path):
    model = f"model_dir={tasks['model']}"
    broken = tmp_path / "broken.yaml"
    broken.write_text("task: broken\ndataset_path: json\n  data_files: [x\n")
    with pytest.raises(InputError, match=rf"^tasks: {broken}:3: the task YAML does not parse"):
        evaluate(make_config(model, f"tasks=[{broken}]", config_name="evaluate"), tmp_path)
    with pytest.raises(InputError, match=r"^tasks: hellaswg is not a task of lm-evaluation-"
                                         r"harness \(nearest: hellaswag"):
        evaluate(make_config(model, "tasks=[hellaswg]", config_name="evaluate"), tmp_path)
    # a task whose data is on the Hub and not cached here: one line, no wait on the network
    remote = tmp_path / "remote.yaml"
    remote.write_text(MC_TASK.replace("task: tiny_mc", "task: remote_mc").replace(
        "dataset_path: json", "dataset_path: allenai/ai2_arc").replace(
        "dataset_kwargs:\n  data_files:\n    test: {data}\n", ""))
    with pytest.raises(InputError, match=r"^tasks: remote_mc: a task's data is neither local "
                                         r"nor cached, and evaluate runs offline"):
        evaluate(make_config(model, f"tasks=[{remote}]", config_name="evaluate"), tmp_path)
    assert not Path(tmp_path / "evaluation.json").exists()


def test_a_task_yamls_data_on_s3_scores_as_the_local_one(tasks, s3, tmp_path):
    """A task YAML whose ``data_files`` are an S3 object (the multiple-choice task) or an S3 glob
    (the generation task, its rows split over two objects): fetched once into a scratch copy of
    the YAMLs' folder, they score what the local files score; a missing object is one line."""
    model, given = f"model_dir={tasks['model']}", tasks["dir"]
    local = evaluate(make_config(model, f"tasks=[{given / 'mc.yaml'},{given / 'gen.yaml'}]",
                                 config_name="evaluate"), tmp_path / "local")
    rows = (tasks["dir"] / "data.jsonl").read_text().splitlines(keepends=True)
    prefix = f"s3://{BUCKET}/tasks"
    storage.write_text(f"{prefix}/mc/data.jsonl", "".join(rows), s3)
    storage.write_text(f"{prefix}/gen/a.jsonl", "".join(rows[:2]), s3)
    storage.write_text(f"{prefix}/gen/b.jsonl", "".join(rows[2:]), s3)
    folder = tmp_path / "yamls"
    folder.mkdir()
    (folder / "mc.yaml").write_text(MC_TASK.format(data=f"{prefix}/mc/data.jsonl"))
    (folder / "gen.yaml").write_text(GEN_TASK.format(data=f"{prefix}/gen/*.jsonl"))
    remote = evaluate(make_config(model, f"s3.endpoint_url={s3.endpoint_url}",
                                  f"tasks=[{folder / 'mc.yaml'},{folder / 'gen.yaml'}]",
                                  config_name="evaluate"), tmp_path / "remote")
    assert remote["tasks"] == local["tasks"]
    assert remote["harness"]["results"]["tiny_gen"]["sample_len"] == len(QUESTIONS)
    (folder / "mc.yaml").write_text(MC_TASK.format(data=f"{prefix}/nowhere.jsonl"))
    with pytest.raises(InputError, match=r"^tasks: a task YAML in .* names s3://.*/nowhere.jsonl, "
                                         r"which could not be read"):
        evaluate(make_config(model, f"s3.endpoint_url={s3.endpoint_url}",
                             f"tasks=[{folder / 'mc.yaml'}]", config_name="evaluate"),
                 tmp_path / "missing")


def test_a_querys_rows_score_as_the_same_rows_in_a_local_file(ray_cluster, tasks, tmp_path):
    """``data.query`` gives the task YAML's rows (Spark SQL over a Parquet file of the questions):
    the harness scores the rows it selects, as it scores the same rows in a local file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = task_rows()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "questions.parquet")
    query = (f"SELECT question, choices, answer FROM parquet.`{tmp_path / 'questions.parquet'}` "
             "WHERE answer = 1")
    mc, model = tasks["dir"] / "mc.yaml", f"model_dir={tasks['model']}"
    found = evaluate(make_config(model, f"tasks=[{mc}]", f'data.query="{query}"',
                                 config_name="evaluate"), tmp_path / "query")
    chosen = [r for r in rows if r["answer"] == 1]
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chosen))
    (tmp_path / "local" / "mc.yaml").write_text(MC_TASK.format(data=tmp_path / "local" /
                                                               "rows.jsonl"))
    local = evaluate(make_config(model, f"tasks=[{tmp_path / 'local' / 'mc.yaml'}]",
                                 config_name="evaluate"), tmp_path / "local_run")
    assert found["harness"]["results"]["tiny_mc"]["sample_len"] == len(chosen) == 2
    assert found["tasks"] == local["tasks"]
    with pytest.raises(InputError, match=r"^data.query gives one task's rows, and tasks="):
        evaluate(make_config(model, f"tasks=[{mc},{tasks['dir'] / 'gen.yaml'}]",
                             f'data.query="{query}"', config_name="evaluate"), tmp_path / "two")


def test_tasks_scored_at_a_runs_checkpoints_equal_evaluate_on_them(ray_cluster, corpus_dir,
                                                                   tasks, tmp_path):
    """``train.eval_tasks``: the task columns at each checkpoint's step are what evaluate gives on
    that checkpoint afterwards; ``train.best_by`` names the best checkpoint by a task score and
    exports it to ``best_model/``."""
    mc = tasks["dir"] / "mc.yaml"
    summary = train(make_config(
        "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.batch_size=8", "train.max_steps=8", "train.eval_interval=2",
        "train.checkpoint_interval=4", f"train.eval_tasks=[{mc}]", f"data.path={corpus_dir}",
        "train.best_by=task_tiny_mc_acc", "train.keep_checkpoints=1",
        f"data.cache_dir={CACHE_DIR}", "sample.max_new_tokens=5", NO_CHECK), tmp_path / "run")
    assert summary["status"] == "finished"
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run" / "metrics.csv")}
    assert sorted(rows) == [2, 4, 6, 8]
    assert rows[2]["task_tiny_mc_acc"] is None and rows[6]["task_tiny_mc_acc"] is None
    _assert_the_best_checkpoint_is_exported(summary, rows, tmp_path / "run")
    (checkpoint,) = [p.parent for p in (tmp_path / "run").glob(
        "ray_results/*/checkpoint_*/train_state.json") if json.loads(p.read_text())["step"] == 8]
    after = evaluate(make_config(f"model_dir={checkpoint}", f"tasks=[{mc}]",
                                 config_name="evaluate"), tmp_path / "after")
    assert rows[8]["task_tiny_mc_acc"] == pytest.approx(after["tasks"]["tiny_mc"]["acc"],
                                                        abs=1e-9)
    assert rows[4]["task_tiny_mc_acc"] is not None


def _assert_the_best_checkpoint_is_exported(summary: dict, rows: dict, run_dir: Path) -> None:
    """The best of the checkpoints at steps 4 and 8 by the task's accuracy (the later of
    equals), with its value in metrics.csv; best_model/ holds its weights."""
    best = summary["best_checkpoint"]
    scores = {step: rows[step]["task_tiny_mc_acc"] for step in (4, 8)}
    assert best["by"] == "task_tiny_mc_acc" and best["order"] == "max"
    assert best["step"] == max(scores, key=lambda step: (scores[step], step))
    assert best["value"] == pytest.approx(scores[best["step"]], abs=1e-12)
    assert best["model"] == str(run_dir / "best_model")
    state = json.loads((Path(best["checkpoint"]) / "train_state.json").read_text())
    assert state["step"] == best["step"]  # kept, though train.keep_checkpoints=1
    exported, _ = load_model_dir(run_dir / "best_model")
    kept, _ = load_model_dir(Path(best["checkpoint"]))
    for name, tensor in kept.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name
