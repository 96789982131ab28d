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
        ("3", "model.n_head=1.5", "failed"),  # does not compose: a row, not the sweep's end
    ]
    assert "model.n_embd=32 is not divisible by model.n_head=3" in rows[2]["error"]
    assert rows[3]["error"] == ("its settings do not compose: Error merging override "
                                "model.n_head=1.5; Value '1.5' of type 'float' could not be "
                                "converted to Integer")
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
    assert "job 2 failed: model.n_embd=32 is not divisible by model.n_head=3" in table
    assert "sweep: 2 of 4 jobs completed" in out.stdout

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
            "model.n_head=1,2,3,1.5",
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


def _run_record(job_dir: Path) -> dict:
    return json.loads((job_dir / "run.json").read_text())


def test_a_killed_sweep_continues_on_the_default_launcher_each_job_from_its_own_checkpoints(
        corpus_dir, tmp_path):
    """One job after another in the sweep's process (the embedded default), over settings a
    checkpoint's fingerprint leaves out (workers, evaluation interval): SIGKILLed once job 0 ended
    and job 1 checkpointed (of 200 steps, about 4 s), then the same command with more CPUs (how it
    runs, not what its jobs are). Job 0 is not run again, job 1 continues its own checkpoint, jobs
    2 and 3 start afresh (none reads a sibling's), and nothing the killed command started outlives
    the second."""
    from helpers import commands
    from helpers.processes import alive, kill_driver
    from helpers.terminal import wait_for
    from raydp_llm.checkpoint.layout import STATE_JSON

    sweep_dir = tmp_path.resolve() / "sweep"
    command = ["-m", "train.eval_interval=10,20", "train.num_workers=1,2", *SWEEP_JOB[:4],
               "train.max_steps=200", "train.checkpoint_interval=20", "train.eval_batches=2",
               "sample.max_new_tokens=10", f"data.path={corpus_dir}", NO_CHECK,
               f"data.cache_dir={tmp_path / 'cache'}", "cluster.dashboard=false",
               f"hydra.sweep.dir={sweep_dir}"]
    first = commands.start("raydp_llm.train", *command)
    wait_for(first, lambda: (sweep_dir / "jobs.jsonl").is_file()
             and any((sweep_dir / "1").rglob(STATE_JSON)), "job 1's first checkpoint", 600)
    started = kill_driver(first)
    files_before = {p: p.stat().st_mtime_ns for p in (sweep_dir / "0").rglob("*")}  # job 0 ended
    again = commands.run("raydp_llm.train", *command, "cluster.num_cpus=3", timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert alive(started) == [], "processes of the killed sweep outlived the one continuing it"

    with (sweep_dir / "sweep_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"], r["steps"]) for r in rows] == [
        (str(n), "completed", "200") for n in range(4)]
    assert "1 of 4 jobs done before" in again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in (sweep_dir / "0").rglob("*")} == files_before
    assert _run_record(sweep_dir / "1")["resumed_from"].startswith(
        str(sweep_dir / "1.attempt-1") + "/")
    assert [_run_record(sweep_dir / str(n))["resumed_from"] for n in (2, 3)] == [None, None]
