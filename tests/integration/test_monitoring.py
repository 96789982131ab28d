"""Watching a real (tiny) training run from outside: the Ray dashboard's REST API behind its token,
the run's own Prometheus metrics, TensorBoard events and the plots; and what the run exposes: the
ports it listens on, and where its secrets end up."""

from __future__ import annotations

import http.client
import json
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import ray

from helpers import commands
from helpers.exposure import Watch, files_holding
from helpers.processes import command_line, niceness

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end-to-end runs


def get(url: str, token: str | None = None) -> tuple[int, str]:
    """The status and body of a GET; status 0 when nothing answered within 10 s (a busy dashboard
    on 2 cores), the port refused (a server still starting) or the server closed the connection
    without an answer (a dashboard stopping with its run): polled again."""
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except (TimeoutError, urllib.error.URLError, ConnectionError, http.client.HTTPException):
        return 0, ""


def wait_for(what: str, check, timeout_s: float = 120.0, every_s: float = 0.5):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    pytest.fail(f"timed out waiting for {what}")


WATCHED_RUN = [
    "name=watched",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=32",
    "model.block_size=16",
    "train.batch_size=8",
    # one worker, so that Ray's metrics agent, which yields the CPU to training (nice 19), has a
    # core; with both cores training it exported the run's figures only after runs had ended
    "train.num_workers=1",
    "train.max_steps=8000",  # 15-25 s of steps: the test reaches the metrics while it trains
    "train.eval_interval=2000",
    "train.eval_batches=2",
    "train.checkpoint_interval=0",
    "sample.max_new_tokens=10",
]


# Ray reports metrics every 10 s by default (docs/monitoring.md)
EXPORT_EVERY_SECOND = {"RAY_metrics_report_interval_ms": "1000"}


def _assert_the_dashboard_is_on_the_loopback_behind_its_token(dashboard: str,
                                                              run: psutil.Process) -> str:
    """The dashboard answers on 127.0.0.1 only, and only with the token, which it returns; its
    processes (``run``'s) yield the CPU to training (nice 19), and still answer."""
    host, port = dashboard.removeprefix("http://").rsplit(":", 1)
    assert host == "127.0.0.1"
    node_ip = ray.util.get_node_ip_address()
    if (
        node_ip != "127.0.0.1"
    ):  # bound to the loopback only: the machine's own address gets no answer
        with pytest.raises(OSError):
            socket.create_connection((node_ip, int(port)), timeout=5).close()
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    assert get(f"{dashboard}/api/jobs/")[0] == 401  # no token, no entry
    assert get(f"{dashboard}/api/jobs/", token="not-the-token")[0] in (401, 403)
    helpers = [p for p in run.children(recursive=True)
               if "dashboard/dashboard.py" in command_line(p)]
    assert len(helpers) == 1 and helpers[0].nice() == 19
    assert all(n in (None, 19) for n in map(niceness, helpers[0].children(recursive=True)))
    assert get(f"{dashboard}/api/jobs/", token=token)[0] == 200
    return token


def _train_run(dashboard: str, token: str, run_name: str):
    """The Ray Train run named ``run_name`` in the dashboard's list, or a falsy value."""
    status, body = get(f"{dashboard}/api/train/v2/runs/v1", token)
    return status == 200 and next(
        (r for r in json.loads(body)["train_runs"] if r["name"] == run_name), None
    )


def _assert_the_run_shows_while_it_trains(dashboard: str, token: str, num_workers: int,
                                          out: Path) -> str:
    """While it trains: the workers, the Ray Train run, and the run's own metrics in Ray's
    Prometheus endpoint. Returns the run's name."""
    def training_workers():
        status, body = get(f"{dashboard}/api/v0/actors?detail=1&limit=1000", token)
        actors = json.loads(body)["data"]["result"]["result"] if status == 200 else []
        alive = [a for a in actors if "RayTrainWorker" in a["class_name"] and a["state"] == "ALIVE"]
        return len(alive) == num_workers

    wait_for("every training worker in the Actors list", training_workers)
    run_name = wait_for(
        "the run's directory", lambda: next((out / "ray_results").glob("watched-*"), None)
    ).name

    shown = wait_for("the Ray Train run", lambda: _train_run(dashboard, token, run_name))
    assert shown["status"] in ("INITIALIZING", "SCHEDULING", "RUNNING", "FINISHED")

    nodes = get(f"{dashboard}/nodes?view=summary", token)[1]  # where the node's metrics are
    port = re.search(r'"metricsExportPort": (\d+)', nodes)[1]
    metrics_url = f"http://127.0.0.1:{port}/metrics"

    def exported():
        text = get(metrics_url)[1]
        return [line for line in text.splitlines() if line.startswith("ray_raydp_llm_train_loss")
                and f'run="{run_name}"' in line]

    assert float(wait_for("the run's metrics", exported, timeout_s=90)[0].rsplit(" ", 1)[1]) > 0
    return run_name


def _assert_tensorboard_events_and_plots(out: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("val_loss")] == [2000, 4000, 6000, 8000]
    assert {"train_loss", "tokens_per_s", "grad_norm", "rss_mb", "lr"} <= set(
        events.Tags()["scalars"]
    )
    for png in ("loss.png", "throughput.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def _assert_it_listened_on_the_loopback_alone(watch: Watch) -> None:
    """Every TCP port of the run's processes (Ray's GCS, raylet, dashboard and workers; Spark's
    driver, RayDP's app master and executors; py4j) listened on 127.0.0.1, but one: torch's
    TCPStore, the DDP rendezvous of Ray Train's rank 0 (torch 2.13 binds it to ``::``, whatever
    MASTER_ADDR says: docs/security.md)."""
    assert len(watch.listeners) >= 15, watch.listeners  # Ray's, Spark's, the dashboard's
    # a process seen as it ended has no command line: its first word is ""
    javas = [lst for lst in watch.listeners.values()
             if lst.process.partition(" ")[0].endswith("java")]
    assert len(javas) >= 4, watch.listeners  # the driver's, the app master's, the executor's
    wide = watch.wide()
    assert len(wide) <= 1 and all("RayTrainWorker" in lst.process for lst in wide), wide


def _assert_no_secret_was_written(watch: Watch, roots: list[Path], console: str,
                                  aws_secret: str, tmp_path: Path) -> None:
    """Neither the Spark application's secret, nor Ray's token, nor the AWS secret key of the
    environment is in the run's directory (MLflow's store in it), the ETL cache, the console or
    any process's command line; the secret's credentials file is gone."""
    (tmp_path / "console.txt").write_text(console)
    assert len(watch.spark_secrets) == 1, watch.spark_secrets  # the ETL's Spark application
    needles = {"Spark's secret": watch.spark_secrets.pop(),
               "Ray's token": (Path.home() / ".ray" / "auth_token").read_text().strip(),
               "AWS_SECRET_ACCESS_KEY": aws_secret}
    assert all(len(text) >= 16 for text in needles.values())
    assert files_holding([*roots, tmp_path / "console.txt"], needles) == []
    assert [f"{name} in {line}" for line in watch.command_lines
            for name, text in needles.items() if text in line] == []
    assert watch.credentials_left() == []


def _assert_the_scratch_went_under_its_directory(scratch: Path, out: Path) -> None:
    """cluster.scratch_dir: the embedded Ray's session (the RayDP executor's working directory in
    it) and Spark's local directories under it."""
    [session] = (scratch / "ray").glob("session_2*")
    assert list(session.glob("app-*")), list(session.iterdir())  # RayDP's executor ran there
    assert (scratch / "spark").is_dir()  # Spark made its local directories there (gone at stop)
    events = next((out / "spark-events").iterdir()).read_text()
    assert f'"spark.local.dir":"{scratch}/spark"' in events


def test_dashboard_metrics_and_tensorboard_follow_a_training_run(corpus_dir, tmp_path):
    """``python -m raydp_llm.train`` as a user runs it, with its embedded Ray's dashboard (the
    tests' own Ray runs none), watched from outside at the address its console gives; its
    ETL in a cache of its own (Spark runs) and its parameters and metrics in MLflow."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    cache, out = tmp_path / "cache", tmp_path / "run"
    # short: Ray's sockets go under it (cluster.scratch_dir)
    scratch = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    aws_secret = secrets.token_hex(20)  # one the environment holds, as a user's would
    proc = commands.start("raydp_llm.train", f"data.path={corpus_dir}", *WATCHED_RUN,
                          "cluster.dashboard=true", f"cluster.dashboard_port={port}",
                          f"hydra.run.dir={out}",
                          f"cluster.scratch_dir={scratch}",
                          f"data.cache_dir={cache}", "tracking=mlflow",
                          f"tracking.uri=sqlite:///{out}/mlflow.db",
                          env=EXPORT_EVERY_SECOND | {"AWS_SECRET_ACCESS_KEY": aws_secret})
    watch = Watch(proc.pid).start()
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    dashboard = wait_for("the dashboard's address on the console", lambda: next(
        (m[1] for line in list(lines) if (m := re.search(r"Ray dashboard: (http://\S+)", line))),
        None), timeout_s=180)
    assert dashboard == f"http://127.0.0.1:{port}"
    run = psutil.Process(proc.pid)
    token = _assert_the_dashboard_is_on_the_loopback_behind_its_token(dashboard, run)
    run_name = _assert_the_run_shows_while_it_trains(dashboard, token, 1, out)
    jobs = json.loads(get(f"{dashboard}/api/jobs/", token)[1])
    assert any(job["metadata"].get("raydp_llm_run") == "watched" for job in jobs)  # the driver's
    statuses = []  # the run's, until it shows as finished or the command (and its dashboard) ends

    def finished():
        shown = _train_run(dashboard, token, run_name)
        statuses.append(shown and shown["status"])
        return statuses[-1] == "FINISHED" or proc.poll() is not None

    # The embedded Ray, and its dashboard, stop with the command: the finished run shows for the
    # second or two the driver still runs after training (measured 1.3 s)
    wait_for("the finished run", finished, 300, every_s=0.05)
    assert "FINISHED" in statuses, statuses[-5:]
    assert proc.wait(timeout=300) == 0, "".join(lines)[-3000:]
    watch.join()
    _assert_tensorboard_events_and_plots(out)
    _assert_it_listened_on_the_loopback_alone(watch)
    _assert_the_scratch_went_under_its_directory(scratch, out)
    _assert_no_secret_was_written(watch, [out, cache, scratch], "".join(lines), aws_secret,
                                  tmp_path)
    shutil.rmtree(scratch, ignore_errors=True)
