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
