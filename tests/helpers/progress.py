"""Waiting on a run in another thread or process: a condition with a deadline, a metrics row."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from raydp_llm.training.driver.metrics import read_metrics


def wait_for(condition, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended before {what}: {proc.communicate()[0][-3000:]}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def has_row(out_dir: Path, step: int) -> bool:
    path = out_dir / "metrics.csv"
    return path.exists() and any(r["step"] >= step for r in read_metrics(path))
