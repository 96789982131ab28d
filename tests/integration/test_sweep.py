"""A real ``-m`` sweep: every job on one Ray, the ETL once, a failed job recorded, the summary and
the plot; and what its console shows."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.configs import NO_CHECK
from helpers.paths import ROOT
from raydp_llm.training.driver.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a sweep of three jobs


# each job of the sweep: a few steps of a tiny model
SWEEP_JOB = [
    "model.n_layer=1",
    "model.n_embd=32",
    "model.block_size=16",
    "train.batch_size=8",
    "train.max_steps=20",
    "train.eval_interval=10",
    "train.eval_batches=2",
    "train.checkpoint_interval=0",
    "sample.max_new_tokens=10",
]


def _assert_summary_rows(rows: list[dict], sweep_dir: Path) -> None:
    assert [(r["job"], r["overrides"], r["status"]) for r in rows] == [
        ("0", "model.n_head=1", "completed"),
        ("1", "model.n_head=2", "completed"),
        ("2", "model.n_head=3", "failed"),
    ]
    assert "model.n_embd=32 is not divisible by model.n_head=3" in rows[2]["error"]
    for row in rows[:2]:
        assert 0 < float(row["best_val_loss"]) <= float(row["final_val_loss"]) < 10
        assert (
            float(row["final_val_bpc"]) > 0
            and float(row["tokens_per_s"]) > 0
            and float(row["wall_s"]) > 0
        )
        job_dir = Path(row["output_dir"])
        assert job_dir.parent == sweep_dir and (job_dir / "model" / "model.safetensors").is_file()
        assert (job_dir / ".hydra" / "overrides.yaml").is_file() and (
            job_dir / "train.log"
        ).is_file()
        assert (
            len(list((job_dir / "ray_results").iterdir())) == 1
        )  # its own Ray Train run, nobody else's


def _assert_the_console(out: subprocess.CompletedProcess, rows: list[dict]) -> None:
    # The console table marks the best job and names the failure.
    best = min(rows[:2], key=lambda r: float(r["best_val_loss"]))["job"]
    table = out.stdout[out.stdout.index("job  overrides"):]
    assert any(line.startswith(f"*  {best} ") for line in table.splitlines())
    assert "job 2 failed: error: model.n_embd=32 is not divisible by model.n_head=3" in table
    assert "sweep: 2 of 3 jobs completed" in out.stdout

    # The console: the progress bars of the ETL and of training, evaluation lines, and no Java stack
    # traces.
    console = out.stdout + out.stderr
    assert (
        "ETL: 100%" in console and "train: 100%" in console and "step 20/20 | train loss" in console
    )
    assert (
        "Exception in thread" not in console
        and "\tat org." not in console
        and "\tat java." not in console
    )


def _assert_mlflow_job(client, job, row: dict, parent) -> None:
    """A job's nested run: its settings, its evaluations, its outputs and the data's fingerprint."""
    assert job.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert job.info.status == "FINISHED" and job.data.params["train.max_steps"] == "20"
    summary = json.loads((Path(row["output_dir"]) / "summary.json").read_text())
    assert job.data.tags["raydp_llm.data_fingerprint"] == summary["etl"]["etl_key"]
    assert job.data.tags["mlflow.runName"].startswith("raydp_llm-")
    losses = client.get_metric_history(job.info.run_id, "val_loss")
    assert [(m.step, m.value) for m in losses] == [
        (r["step"], pytest.approx(r["val_loss"]))
        for r in read_metrics(Path(row["output_dir"]) / "metrics.csv")]
    assert {"summary.json", "manifest.json", "metrics.csv", "loss.png", "samples.txt",
            "model"} <= {a.path for a in client.list_artifacts(job.info.run_id)}
    assert "model/model.safetensors" in {
        a.path for a in client.list_artifacts(job.info.run_id, "model")}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True)
    if commit.returncode == 0:  # a git checkout: the run says which commit ran
        assert job.data.tags["mlflow.source.git.commit"] == commit.stdout.strip()


def _assert_mlflow_runs(mlflow_server: str, sweep_dir: Path, rows: list[dict]) -> None:
    # MLflow: one parent run holding the summary, the two jobs that ran nested under it, each with
    # its settings, its evaluations, its outputs and the data's fingerprint.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    found = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    assert parent.data.tags["raydp_llm.sweep_dir"] == str(sweep_dir.resolve())
    assert parent.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {
        "sweep_summary.csv", "sweep.png"}
    jobs = sorted((r for r in found if r.info.run_id != parent.info.run_id),
                  key=lambda r: r.data.params["model.n_head"])
    assert [r.data.params["model.n_head"] for r in jobs] == ["1", "2"]
    for job, row in zip(jobs, rows[:2]):
        _assert_mlflow_job(client, job, row, parent)


def test_sweep_runs_every_job_on_one_ray_and_writes_the_summary(corpus_dir, tmp_path,
                                                                mlflow_server):
    """... and tracked in MLflow: a parent run for the sweep, a nested run per job that ran."""
    ray_tmp, sweep_dir = (
        Path(tempfile.mkdtemp(prefix="ray", dir="/tmp")),
        tmp_path / "sweep",
    )  # short: Ray's sockets
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydp_llm.train",
            "-m",
            "model.n_head=1,2,3",
            f"data.path={corpus_dir}",
            f"data.cache_dir={tmp_path / 'cache'}",
            NO_CHECK,
            *SWEEP_JOB,
            f"hydra.sweep.dir={sweep_dir}",
            "tracking=mlflow",
            f"tracking.uri={mlflow_server}",
            "tracking.experiment=sweep",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RAY_TMPDIR": str(ray_tmp)},
    )
    assert out.returncode == 0, out.stderr[-3000:]

    with (sweep_dir / "sweep_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    _assert_summary_rows(rows, sweep_dir)
    assert (sweep_dir / "sweep.png").stat().st_size > 10_000

    # One Ray for the sweep; the ETL ran for the first job and the second read its output from the
    # cache.
    assert len(list((ray_tmp / "ray").glob("session_2*"))) == 1
    etl = [
        json.loads((Path(r["output_dir"]) / "summary.json").read_text())["etl"]["cache_hit"]
        for r in rows[:2]
    ]
    assert etl == [False, True]

    _assert_the_console(out, rows)
    _assert_mlflow_runs(mlflow_server, sweep_dir, rows)
