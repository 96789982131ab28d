"""The suite's deadline (tests/fixtures/budget.py): past it, the suite stops after the running test
with one line, its report and a failing status, rather than running into CI's limit."""

from __future__ import annotations

import subprocess
import sys

from helpers.paths import ROOT


def test_past_its_limit_the_suite_stops_after_the_running_test_with_its_report(tmp_path):
    (tmp_path / "test_three.py").write_text(
        "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n\n\ndef test_three():\n"
        "    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fixtures.budget", "-p", "no:cacheprovider",
         "-rA", "--durations=5", "-c", "/dev/null", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT / "tests"), "RAYDP_LLM_SUITE_LIMIT_MIN": "0",
             "PATH": "/usr/bin:/bin"})
    out = done.stdout + done.stderr
    assert done.returncode == 2, out  # pytest's "interrupted": CI reads it as failed
    ran = [line for line in out.splitlines() if line.startswith("PASSED ")]
    assert ran == ["PASSED test_three.py::test_one"], out
    assert "! Interrupted: the suite has run 0 minutes, past its limit of 0 " in out, out
    assert "stopped after test_three.py::test_one" in out and "slowest 5 durations" in out, out
    assert "1 passed" in out, out
