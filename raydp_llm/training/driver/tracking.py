"""Experiment tracking in MLflow (``tracking=mlflow``): each run's settings as parameters, every
evaluation's metrics at its step, its outputs as artifacts, and tags (run name, data fingerprint,
git commit). Off by default (``NoTracking``).

The driver logs, rank 0's figures: they reach it row by row through ``metrics.csv``, as they reach
the console (progress.py), so the training loop never waits on a tracking server, and the default
store (a SQLite file under ``outputs/``) needs no server and no reach from the workers' nodes. (Ray
Train's ``setup_mlflow`` runs in the workers instead: a restarted worker group would start its run
again, and workers on other nodes could not write the driver's local store.)

A resumed run continues the MLflow run of the run it resumes (its ``run.json``, beside the
checkpoint, names it). The jobs of a sweep nest under one parent run, which
``cli/sweep/summary.py`` opens and closes; a job finds it by its tag, the sweep directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Iterator

from raydp_llm.core import storage
from raydp_llm.core.config import TrackingSettings
from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.storage import S3Options
from raydp_llm.training.driver.metrics import read_metrics

log = logging.getLogger(__name__)

LOCAL_STORE = Path("outputs") / "mlflow.db"  # where the command runs, beside the run directories
SWEEP_TAG = "raydp_llm.sweep_dir"
RUN_TAG = "raydp_llm.run_id"
OUTPUT_FILES = ("summary.json", "manifest.json", "metrics.csv", "loss.png", "throughput.png",
                "samples.txt")
PARAMS_PER_CALL = 100  # MLflow's log_batch takes at most 100 parameters
# data.table's formats as MLflow names their sources (its DeltaDatasetSource's type for Delta)
TABLE_SOURCES = {"delta": "delta_table", "iceberg": "iceberg_table"}


def store_uri(cfg: TrackingSettings) -> str:
    """``tracking.uri``, or the local store: ``outputs/mlflow.db`` where the command runs."""
    return cfg.uri or f"sqlite:///{LOCAL_STORE.resolve()}"


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` store URI, else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def experiment_id(client, cfg: TrackingSettings) -> str:
    """The experiment ``tracking.experiment``, created when new. A SQLite store keeps its artifacts
    beside it (``outputs/mlartifacts``), not in MLflow's default ``./mlruns`` where the command
    runs; a server decides for itself."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(cfg.experiment)
    if found is not None:
        return found.experiment_id
    database, location = _sqlite_file(store_uri(cfg)), None
    if database:
        location = (database.parent / "mlartifacts").as_uri()
    try:
        return client.create_experiment(cfg.experiment, artifact_location=location)
    except MlflowException:  # a run beside this one created it meanwhile
        return client.get_experiment_by_name(cfg.experiment).experiment_id


def connect(cfg: TrackingSettings):
    """An MLflow client on the store, and the experiment's id; one line when MLflow is not
    installed or the store cannot be reached (before any engine starts)."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise InputError("tracking=mlflow needs MLflow: pip install 'raydp_llm[mlflow]' (or set "
                         "tracking=none)") from None
    uri = store_uri(cfg)
    database = _sqlite_file(uri)
    if database:
        database.parent.mkdir(parents=True, exist_ok=True)
    elif uri.startswith(("http://", "https://")):
        _check_server(uri)
    client = MlflowClient(tracking_uri=uri)
    return client, experiment_id(client, cfg)


def _check_server(uri: str, timeout_s: float = 10.0) -> None:
    """One line, at once, when a tracking server does not answer (MLflow's own client retries for
    minutes)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
    except (urllib.error.URLError, OSError) as err:
        raise InputError(f"tracking.uri={uri}: no MLflow server answers there ({err}); start it "
                         "(mlflow server --host ...), fix the address, or leave tracking.uri "
                         "unset for a local store") from None


def flat_params(settings) -> dict[str, str]:
    """The settings as ``section.key`` → text (lists and dicts as JSON), MLflow's parameters."""
    out = {}

    def walk(prefix: str, value) -> None:
        if is_dataclass(value):
            value = asdict(value)
        if isinstance(value, dict) and all(isinstance(k, str) for k in value) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            out[prefix] = value if isinstance(value, str) else json.dumps(value)

    walk("", settings)
    return out


def git_commit(where: Path) -> str | None:
    """The commit checked out where the command runs, when that is a git work tree."""
    try:
        done = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def continued_run(resumed_from: str | None, s3: S3Options) -> str | None:
    """The MLflow run of the run that wrote checkpoint ``resumed_from``: its ``run.json`` lies
    beside the checkpoint, in that run's Ray Train directory."""
    if not resumed_from:
        return None
    from raydp_llm.training.driver.runs import RECORD, read_record, run_dir_of

    record = read_record(storage.join(run_dir_of(resumed_from), RECORD), s3)
    return record.mlflow_run_id if record else None


def table_input(table: dict):
    """``data.table``'s snapshot (``data/inputs/tables.py``'s record) as the MLflow run's dataset
    input, for training: a Delta table with the source fields of MLflow's own
    ``DeltaDatasetSource``."""
    import hashlib

    from mlflow.entities import Dataset, DatasetInput, InputTag

    if table["format"] == "delta":
        pinned, source = table["version"], {"path": table["uri"],
                                            "delta_table_version": table["version"]}
    else:
        pinned, source = table["snapshot_id"], {"table": table["uri"],
                                                "snapshot_id": table["snapshot_id"]}
    digest = hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:8]
    dataset = Dataset(name=f"{table['uri']}@{pinned}", digest=digest,
                      source_type=TABLE_SOURCES[table["format"]], source=json.dumps(source),
                      profile=json.dumps({"num_rows": table["rows"], "files": table["files"],
                                          "timestamp": table["timestamp"]}))
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training")])


def sweep_parent(client, experiment: str, sweep_dir: str | None) -> str | None:
    """The parent run ``cli/sweep/summary.py`` opened for the sweep in ``sweep_dir``."""
    if not sweep_dir:
        return None
    found = client.search_runs([experiment], f"tags.`{SWEEP_TAG}` = '{sweep_dir}'", max_results=1)
    return found[0].info.run_id if found else None


class NoTracking:
    """``tracking=none``: the run's own files are its record."""

    run_id = None

    def start(self, settings, run_name: str, record, fingerprint: str | None,
              sweep_dir: str | None) -> None:
        pass

    def log_row(self, row: dict) -> None:
        pass

    def finish(self, out_dir: Path, status: str) -> None:
        pass

    def _log_rows_after(self, metrics_csv: Path) -> None:
        """The rows of ``metrics_csv`` after the last one logged."""
        for row in read_metrics(metrics_csv) if metrics_csv.exists() else []:
            if row["step"] > self.last_step:
                self.log_row(row)

    def log_evaluation(self, settings, evaluation: dict, out_dir: Path) -> None:
        pass


def evaluation_figures(evaluation: dict) -> dict[str, float]:
    """An evaluation's numbers as MLflow metrics: its figures (loss, perplexity, accuracy, ...,
    and the times), and its tasks' scores as ``task_<task>_<metric>``, as training logs them."""
    from raydp_llm.training.tasks import columns

    figures = {k: float(v) for k, v in evaluation.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return figures | columns(evaluation.get("tasks") or {})


class MlflowTracking(NoTracking):
    """One training run's MLflow run, logged from the driver. A tracking server that fails during
    the run costs a warning, never the run: the files in the run directory hold it all."""

    def __init__(self, cfg: TrackingSettings):
        self.cfg = cfg
        self.client, self.experiment = connect(cfg)
        self.warned = False
        self.last_step = -1  # of the rows logged

    def start(self, settings, run_name: str, record, fingerprint: str | None,
              sweep_dir: str | None) -> None:
        """Open this run's MLflow run, or reopen the one the resumed run logged to; its id goes
        into ``record`` (``run.json``), for a later resume."""
        self._guarded("the run's start", lambda: self._open(settings, run_name, record,
                                                            fingerprint, sweep_dir))

    def _open(self, settings, run_name: str, record, fingerprint: str | None,
              sweep_dir: str | None) -> None:
        tags = {RUN_TAG: record.run_id, "raydp_llm.run_dir": record.out_dir,
                "raydp_llm.data_fingerprint": fingerprint,
                "mlflow.source.git.commit": git_commit(Path.cwd())}
        self.run_id = self._reopened(continued_run(record.resumed_from, S3Options.of(settings.s3)))
        params = flat_params(settings)
        if self.run_id:
            tags["raydp_llm.resumed_from"] = record.resumed_from
            logged = self.client.get_run(self.run_id).data.params
            params = {k: v for k, v in params.items() if k not in logged}  # MLflow's are final
        else:
            parent = sweep_parent(self.client, self.experiment, sweep_dir)
            if parent:
                tags["mlflow.parentRunId"] = parent
            self.run_id = self.client.create_run(self.experiment, run_name=run_name).info.run_id
            if record.table:  # what it trains on (a resumed run's MLflow run has it already)
                self.client.log_inputs(self.run_id, datasets=[table_input(record.table)])
        self._log_batch(params, tags)
        record.mlflow_run_id = self.run_id
        log.info("MLflow: run %s, experiment %s, %s", self.run_id, self.cfg.experiment,
                 store_uri(self.cfg))

    def _reopened(self, run_id: str | None) -> str | None:
        """The resumed run's MLflow run, set running again; None when it is not in this store."""
        if not run_id:
            return None
        from mlflow.exceptions import MlflowException

        try:
            self.client.update_run(run_id, status="RUNNING")
        except MlflowException:
            log.warning("MLflow: the resumed run logged to run %s, which %s does not hold; "
                        "logging to a new run", run_id, store_uri(self.cfg))
            return None
        return run_id

    def _log_batch(self, params: dict[str, str], tags: dict[str, str]) -> None:
        from mlflow.entities import Param, RunTag

        items = [Param(k, v[:6000]) for k, v in params.items()]  # MLflow's longest value
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v])
        for i in range(0, len(items), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=items[i:i + PARAMS_PER_CALL])

    def log_row(self, row: dict) -> None:
        """One ``metrics.csv`` row (an evaluation) at its step."""
        from mlflow.entities import Metric

        if not self.run_id:  # it could not start
            return
        now, step = int(time.time() * 1000), int(row["step"])
        metrics = [Metric(k, float(v), now, step) for k, v in row.items()
                   if k != "step" and v is not None]
        self._guarded("its metrics", lambda: self.client.log_batch(self.run_id, metrics=metrics))
        self.last_step = max(self.last_step, step)

    def finish(self, out_dir: Path, status: str) -> None:
        """The rows of ``metrics.csv`` not logged yet, the outputs as artifacts (what exists of
        them), then the run's end status. A run stopped by Ctrl-C while Ray Train's controller
        wrote its last row ends before the driver's next look at the file: the row is logged
        here, and a resumed run, which continues from that checkpoint, never logs it again."""
        if not self.run_id:
            return
        self._guarded("its last metrics", lambda: self._log_rows_after(out_dir / "metrics.csv"))

        def upload():
            for name in OUTPUT_FILES:
                if (out_dir / name).is_file():
                    self.client.log_artifact(self.run_id, str(out_dir / name))
            if self.cfg.log_model and (out_dir / "model").is_dir():
                self.client.log_artifacts(self.run_id, str(out_dir / "model"), "model")

        self._guarded("the outputs", upload)
        self._guarded("the end", lambda: self.client.set_terminated(self.run_id, status))

    def log_evaluation(self, settings, evaluation: dict, out_dir: Path) -> None:
        """An ``evaluate`` command's own MLflow run: its settings, its figures
        (``evaluation_figures``) and ``evaluation.json``, tagged with the model it scored."""
        from mlflow.entities import Metric

        def log() -> None:
            name = f"evaluate {Path(evaluation['model_dir']).name}"
            self.run_id = self.client.create_run(self.experiment, run_name=name).info.run_id
            self._log_batch(flat_params(settings), {
                "raydp_llm.evaluated": evaluation["model_dir"],
                "mlflow.source.git.commit": git_commit(Path.cwd())})
            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[
                Metric(k, v, now, 0) for k, v in evaluation_figures(evaluation).items()])
            self.client.log_artifact(self.run_id, str(out_dir / "evaluation.json"))
            self.client.set_terminated(self.run_id, "FINISHED")

        self._guarded("the evaluation", log)

    def _guarded(self, what: str, work) -> None:
        try:
            work()
        except Exception as err:  # noqa: BLE001 - tracking never ends a run
            if not self.warned:
                log.warning("MLflow: could not log %s (%s); the run goes on, its files are "
                            "complete in its directory", what, first_line(err, 200))
            self.warned = True


def tracker(cfg: TrackingSettings) -> NoTracking:
    """The run's tracking, as ``tracking.kind`` says; MLflow's store is reached here, before any
    engine starts."""
    return MlflowTracking(cfg) if cfg.kind == "mlflow" else NoTracking()


@contextlib.contextmanager
def tracked(run: NoTracking, out_dir: Path) -> Iterator[NoTracking]:
    """``run`` ends with the block: FINISHED, KILLED (Ctrl-C) or FAILED, its outputs logged in
    each case."""
    status = "FAILED"
    try:
        yield run
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        run.finish(out_dir, status)


def open_sweep(cfg: TrackingSettings, sweep_dir: Path, name: str) -> str:
    """The parent run of a sweep's jobs (they find it by its tag, ``sweep_dir``)."""
    client, experiment = connect(cfg)
    run = client.create_run(experiment, run_name=f"{name} sweep {sweep_dir.name}",
                            tags={SWEEP_TAG: str(sweep_dir)})
    return run.info.run_id


def close_sweep(cfg: TrackingSettings, run_id: str, sweep_dir: Path, completed: bool) -> None:
    """The sweep's summary and plot on its parent run, which ends."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store_uri(cfg))
    for name in ("sweep_summary.csv", "sweep.png"):
        if (sweep_dir / name).is_file():
            client.log_artifact(run_id, str(sweep_dir / name))
    client.set_terminated(run_id, "FINISHED" if completed else "FAILED")
