"""MLflow tracking on its default local store (outputs/mlflow.db, nothing to start), driven as
cli/train.py drives it; the server case runs in test_sweep and test_resume."""

from __future__ import annotations

import json
import math

import pytest

from helpers.configs import make_config
from raydp_llm.core.errors import InputError
from raydp_llm.training.driver import tracking
from raydp_llm.training.driver.runs import RECORD, RunRecord


def outputs(out_dir):
    """A finished run's files, as few as the tracker looks for."""
    (out_dir / "model").mkdir(parents=True)
    (out_dir / "model" / "model.safetensors").write_bytes(b"weights")
    (out_dir / "summary.json").write_text(json.dumps({"status": "finished"}))
    (out_dir / "manifest.json").write_text("{}")


def test_a_run_and_its_resumption_log_to_one_local_mlflow_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # the local store lies under outputs/ where the command runs
    settings = make_config("tracking=mlflow", "model.n_layer=3")
    first = RunRecord(run_id="r1", out_dir=str(tmp_path / "one"))
    with tracking.tracked(tracking.tracker(settings.tracking), tmp_path / "one") as run:
        run.start(settings, "raydp_llm-r1", first, "etl123", None)
        run.log_row({"step": 10, "train_loss": 2.5, "val_loss": 2.25, "gpu_mem_gb": None})
        run.log_row({"step": 20, "train_loss": 2.0, "val_loss": math.nan})
        outputs(tmp_path / "one")
    assert first.mlflow_run_id == run.run_id  # run.json carries it, for a later resume
    store = tmp_path / "outputs" / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    logged = client.get_run(run.run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == "raydp_llm-r1"
    assert logged.data.params["model.n_layer"] == "3" and logged.data.params["data.path"] == "null"
    assert logged.data.tags["raydp_llm.data_fingerprint"] == "etl123"
    history = client.get_metric_history(run.run_id, "val_loss")
    assert [m.step for m in history] == [10, 20] and history[0].value == 2.25
    assert "gpu_mem_gb" not in logged.data.metrics  # not measured: not logged
    assert {a.path for a in client.list_artifacts(run.run_id)} == {"summary.json",
                                                                   "manifest.json", "model"}
    assert (tmp_path / "outputs" / "mlartifacts").is_dir()  # the artifacts beside the store

    # A run resuming a checkpoint of that run continues its MLflow run (run.json names it), even
    # with a setting changed (MLflow's parameters are final: the first value stays).
    checkpoints = tmp_path / "one" / "ray_results" / "raydp_llm-r1"
    checkpoints.mkdir(parents=True)
    (checkpoints / RECORD).write_text(json.dumps({"run_id": "r1", "out_dir": "one",
                                                  "mlflow_run_id": run.run_id}))
    again = make_config("tracking=mlflow", "model.n_layer=3", "train.max_steps=40")
    second = RunRecord(run_id="r2", out_dir=str(tmp_path / "two"),
                       resumed_from=str(checkpoints / "checkpoint_000001"))
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C: the run ends KILLED
        with tracking.tracked(tracking.tracker(again.tracking), tmp_path / "two") as resumed:
            resumed.start(again, "raydp_llm-r2", second, "etl123", None)
            resumed.log_row({"step": 30, "val_loss": 1.5})
            raise KeyboardInterrupt
    assert resumed.run_id == run.run_id
    logged = client.get_run(run.run_id)
    assert logged.info.status == "KILLED" and logged.data.params["train.max_steps"] == "3000"
    assert [m.step for m in client.get_metric_history(run.run_id, "val_loss")] == [10, 20, 30]


def test_a_tracking_server_that_does_not_answer_is_one_line():
    settings = make_config("tracking=mlflow", "tracking.uri=http://127.0.0.1:9")
    with pytest.raises(InputError, match=r"tracking\.uri=http://127\.0\.0\.1:9: no MLflow server "
                                         r"answers there .*leave tracking\.uri unset"):
        tracking.tracker(settings.tracking)
    assert isinstance(tracking.tracker(make_config().tracking), tracking.NoTracking)


def test_settings_become_flat_parameters():
    params = tracking.flat_params(make_config("data.path=[a.txt,b.txt]"))
    assert params["optim.lr"] == "0.001" and params["cluster.spark_conf"] == "{}"
    assert params["required"] == "[]" and params["name"] == "raydp_llm"
    assert json.loads(params["data.path"])[1].endswith("b.txt")


def test_the_emr_runs_store_is_one_place_on_the_primary_wherever_the_job_runs(tmp_path,
                                                                              monkeypatch):
    """``ray job submit`` runs the driver in a directory of its own: the default store (relative,
    ``outputs/mlflow.db``) would land there, one per job; the emr experiment fixes it in HOME, as
    docs/deploy-emr.md says; a server given on the command line still wins."""
    monkeypatch.setenv("HOME", str(tmp_path))
    emr = ["+experiment=emr", "tracking=mlflow"]
    assert tracking.store_uri(make_config(*emr).tracking) == (
        f"sqlite:///{tmp_path}/raydp_llm/outputs/mlflow.db")
    server = make_config(*emr, "tracking.uri=http://mlflow:5000").tracking
    assert tracking.store_uri(server) == "http://mlflow:5000"


def test_a_table_snapshot_is_the_mlflow_runs_dataset_input(tmp_path, monkeypatch):
    """data.table's record (run.json's ``table``) logged as the run's training input, a Delta
    table's source as MLflow's own Delta source names it."""
    from mlflow.data.delta_dataset_source import DeltaDatasetSource
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    settings = make_config("tracking=mlflow")
    table = {"uri": "/data/speeches", "format": "delta", "version": 3,
             "timestamp": "2026-12-01T09:58:31.204+00:00", "files": 2, "rows": 120}
    record = RunRecord(run_id="r1", out_dir=str(tmp_path / "one"), table=table)
    with tracking.tracked(tracking.tracker(settings.tracking), tmp_path / "one") as run:
        run.start(settings, "raydp_llm-r1", record, "etl123", None)
        outputs(tmp_path / "one")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    (given,) = client.get_run(run.run_id).inputs.dataset_inputs
    assert given.dataset.name == "/data/speeches@3"
    assert {t.key: t.value for t in given.tags} == {"mlflow.data.context": "training"}
    assert given.dataset.source_type == DeltaDatasetSource._get_source_type()
    source = DeltaDatasetSource.from_json(given.dataset.source)  # MLflow reads it as its own
    assert source.path == "/data/speeches" and source.delta_table_version == 3
    assert json.loads(given.dataset.profile)["num_rows"] == 120
