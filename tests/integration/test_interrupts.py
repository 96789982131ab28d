"""Ctrl-C as a terminal sends it, while Spark starts and during the hand-off: Spark and Ray stop,
exit 130."""

from __future__ import annotations

import pytest

from helpers.configs import NO_CHECK
from helpers.terminal import start_like_a_terminal, wait_for

ENGINE_PROCESSES = ("raylet", "gcs_server", "java", "ray::")


def engine_processes_started_after(t0: float) -> list[str]:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline", "create_time", "name"]):
        cmd = " ".join(p.info["cmdline"] or []) or (p.info["name"] or "")
        if p.info["create_time"] >= t0 and any(name in cmd for name in ENGINE_PROCESSES):
            found.append(f"{p.pid}: {cmd[:120]}")
    return found


def _logged(path, text: str) -> bool:
    return path.exists() and text in path.read_text()


@pytest.mark.integration
@pytest.mark.slow  # a whole job, twice
@pytest.mark.parametrize("moment", ["spark starting", "hand-off"])
def test_ctrl_c_stops_spark_and_ray(corpus_dir, tmp_path, moment):
    import signal
    import time

    t0 = time.time()
    proc = start_like_a_terminal(
        "raydp_llm.train",
        "+experiment=smoke",
        f"data.path={corpus_dir}",  # a small corpus: the hand-off comes sooner
        f"hydra.run.dir={tmp_path}",
        f"data.cache_dir={tmp_path / 'cache'}",
        NO_CHECK,
    )
    ready = {"spark starting": lambda: (tmp_path / "spark-driver.log").exists(),
             "hand-off": lambda: _logged(tmp_path / "train.log", "ETL: ")}[moment]
    wait_for(proc, ready, f"the moment to interrupt ({moment})", timeout_s=180)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "interrupted: Spark and Ray are stopped" in output
    time.sleep(2)
    assert engine_processes_started_after(t0) == []


@pytest.mark.integration
@pytest.mark.slow  # a sweep's Ray and Spark started
def test_ctrl_c_during_a_sweeps_up_front_etl_ends_the_sweep_with_the_line_to_continue(
        corpus_dir, tmp_path):
    """``hydra/launcher=ray`` runs each data setting's ETL before any trial: Ctrl-C there stops
    that ETL (its Spark with it) and the sweep, exit 130, with the line that continues it; the
    job whose ETL it stopped is no failed row (PySpark turns the interrupt into its own
    exception inside py4j: it was once a failed row per Ctrl-C, the sweep going on)."""
    import signal
    import time

    t0 = time.time()
    sweep = tmp_path / "sweep"
    proc = start_like_a_terminal(
        "raydp_llm.train", "-m", "hydra/launcher=ray", "+experiment=smoke",
        "optim.lr=1e-3,2e-3",  # two jobs: the first one's ETL interrupted, the second none
        f"data.path={corpus_dir}", f"data.cache_dir={tmp_path / 'cache'}",
        f"hydra.sweep.dir={sweep}", "cluster.dashboard=false", NO_CHECK)
    wait_for(proc, lambda: any((sweep / "etl").glob("*/spark-driver.log")),
             "the sweep's first ETL to start its Spark", timeout_s=180)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert f"sweep interrupted: the same command with hydra.sweep.dir={sweep}" in output
    assert "its ETL failed" not in output and "[job 1] data ready" not in output
    time.sleep(2)
    assert engine_processes_started_after(t0) == []
