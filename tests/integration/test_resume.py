"""Checkpoints and exact resume, with a real interrupted run (Ctrl-C in the middle of training)."""

from __future__ import annotations

import json
import signal
import time

import pytest
from mlflow.tracking import MlflowClient

from helpers.configs import CACHE_DIR, NO_CHECK, make_config
from helpers.etl import prepare
from helpers.terminal import start_like_a_terminal
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.cli.train import run
from raydp_llm.core.errors import InputError
from raydp_llm.training.driver.metrics import read_metrics
from raydp_llm.training.driver.run import resume_checkpoint
from raydp_llm.training.spec import build_spec, samplings, windows_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end-to-end runs

# A run long enough (~10 s of training) to be interrupted after its first checkpoint, with dropout
# (RNG), a shuffle buffer, 2 DDP workers and gradient accumulation all in play.
OVERRIDES = [
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=64",
    "model.block_size=32",
    "model.dropout=0.1",
    "train.batch_size=16",
    "train.grad_accum=2",
    "train.max_steps=240",
    "train.eval_interval=20",
    "train.eval_batches=null",
    "train.checkpoint_interval=40",
    f"data.cache_dir={CACHE_DIR}",
    NO_CHECK,
]


def artifacts(client, run) -> set[str]:
    return {a.path for a in client.list_artifacts(run.info.run_id)}


def _interrupt_after_its_first_checkpoint(overrides: list, tracked: list, out) -> list[int]:
    """A run started as from a terminal, Ctrl-C once it has a checkpoint and metrics; the steps of
    its checkpoints."""
    proc = start_like_a_terminal(
        "raydp_llm.train", *overrides, *tracked, f"hydra.run.dir={out}"
    )
    deadline = time.time() + 240
    while not (list(out.glob("ray_results/*/checkpoint_*/train_state.json"))
               and (out / "metrics.csv").exists()):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output[-3000:]
    saved = [
        json.loads(p.read_text())["step"]
        for p in out.glob("ray_results/*/*/train_state.json")
    ]
    assert saved and max(saved) < 240  # stopped mid-run
    return saved


def _assert_the_mlflow_run_continued(client, killed, runs, rows: list[dict], summary: dict) -> None:
    (resumed,) = client.search_runs([killed.info.experiment_id])  # the same MLflow run, continued
    assert resumed.info.run_id == killed.info.run_id and resumed.info.status == "FINISHED"
    history = client.get_metric_history(resumed.info.run_id, "val_loss")
    logged = {m.step for m in history}
    assert logged == {r["step"] for r in read_metrics(runs / "interrupted" / "metrics.csv")} | {
        r["step"] for r in rows} and max(logged) == 240
    assert resumed.data.tags["raydp_llm.resumed_from"] == summary["resumed_from"]
    assert {"summary.json", "manifest.json", "loss.png", "model"} <= artifacts(client, resumed)


def _assert_which_checkpoint_a_run_resumes(cfg, data, overrides: list, runs, found: str) -> None:
    # train.resume=never ignores the checkpoint that auto found; a path names one.
    windows = windows_of(cfg, data.index, data.manifest)  # as the run's
    spec = build_spec(cfg, data.tokenizer, data.manifest, windows, samplings(cfg))
    assert (
        resume_checkpoint(make_config(*overrides, "train.resume=never"), spec, runs / "new") is None
    )
    # The resumed run continued the interrupted one and finished: auto continues neither again.
    assert (
        resume_checkpoint(make_config(*overrides, "train.resume=auto"), spec, runs / "new") is None
    )
    assert check_inputs(make_config(*overrides, f"train.resume={found}")).files
    # A checkpoint of another model shape is refused before any engine starts.
    with pytest.raises(InputError, match=r"the checkpoint's model has block_size=32, n_layer=2, "
                                         r"the config asks for model.block_size=64, "
                                         r"model.n_layer=3; resume with the checkpoint's"):
        check_inputs(
            make_config(
                *overrides, f"train.resume={found}", "model.block_size=64", "model.n_layer=3"
            )
        )


def test_a_resumed_run_continues_as_if_never_stopped(ray_cluster, corpus_dir, tmp_path,
                                                     mlflow_server):
    """... and its MLflow run too: the interrupted run's ends KILLED, the resumed run reopens it."""
    overrides = [f"data.path={corpus_dir}", *OVERRIDES]
    tracked = ["tracking=mlflow", f"tracking.uri={mlflow_server}", "tracking.experiment=resume"]
    cfg = make_config(*overrides)
    data = prepare(
        cfg, check_inputs(cfg), tmp_path, to_ray=False, store=CACHE_DIR
    )  # runs read the cache
    whole = tmp_path / "uninterrupted"
    run(cfg, whole / "run")
    expected = {r["step"]: r for r in read_metrics(whole / "run" / "metrics.csv")}

    runs = tmp_path / "outputs"
    saved = _interrupt_after_its_first_checkpoint(overrides, tracked, runs / "interrupted")
    client = MlflowClient(tracking_uri=mlflow_server)
    (killed,) = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert killed.info.status == "KILLED" and "metrics.csv" in artifacts(client, killed)

    summary = run(make_config(*overrides, *tracked, "train.resume=auto"), runs / "resumed")
    k = max(saved)
    assert summary["resumed_from"] and json.loads((runs / "resumed" / "summary.json").read_text())[
        "resumed_from"
    ].endswith(summary["resumed_from"][-20:])
    rows = read_metrics(runs / "resumed" / "metrics.csv")
    assert [r["step"] for r in rows] == [s for s in expected if s > k]
    for r in rows:
        want = expected[r["step"]]
        assert r["val_loss"] == pytest.approx(want["val_loss"], rel=1e-3), r["step"]
        assert r["train_loss"] == pytest.approx(want["train_loss"], rel=1e-3), r["step"]
    assert (runs / "resumed" / "model" / "model.safetensors").is_file()
    _assert_the_mlflow_run_continued(client, killed, runs, rows, summary)
    assert not (
        runs / "resumed" / "model" / "train_state.pt"
    ).exists()  # the model dir holds no optimizer state

    # Until it stopped, the interrupted run (another process, its own Ray) trained exactly like the
    # first one.
    before = read_metrics(runs / "interrupted" / "metrics.csv")
    assert before and all(
        r["val_loss"] == pytest.approx(expected[r["step"]]["val_loss"], rel=1e-6) for r in before
    )
    _assert_which_checkpoint_a_run_resumes(cfg, data, overrides, runs, summary["resumed_from"])
