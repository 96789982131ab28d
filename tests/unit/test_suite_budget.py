"""The suite's deadlines (tests/fixtures/budget.py): past its limit, the suite stops after the
running test with one line, its report and a failing status, rather than running into CI's limit;
a hung test ends the suite with every stack, the line naming it last."""

from __future__ import annotations

import subprocess
import sys
import time

from helpers.paths import ROOT


def _pytest(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """A real pytest of ``tmp_path``'s tests with the budget plugin alone and ``env`` set."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fixtures.budget", "-p", "no:cacheprovider",
         "-c", "/dev/null", *args, str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT / "tests"), "PATH": "/usr/bin:/bin", **env})


def test_past_its_limit_the_suite_stops_after_the_running_test_with_its_report(tmp_path):
    (tmp_path / "test_three.py").write_text(
        "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n\n\ndef test_three():\n"
        "    pass\n")
    done = _pytest(tmp_path, "-rA", "--durations=5", RAYDP_LLM_SUITE_LIMIT_MIN="0")
    out = done.stdout + done.stderr
    assert done.returncode == 2, out  # pytest's "interrupted": CI reads it as failed
    ran = [line for line in out.splitlines() if line.startswith("PASSED ")]
    assert ran == ["PASSED test_three.py::test_one"], out
    assert "! Interrupted: the suite has run 0 minutes, past its limit of 0 " in out, out
    assert "stopped after test_three.py::test_one" in out and "slowest 5 durations" in out, out
    assert "1 passed" in out, out


def test_a_test_whose_clean_up_hangs_after_its_time_out_ends_the_suite_with_every_stack(tmp_path):
    """The hang of 2026-12-02: pytest-timeout's alarm failed the test, and its clean-up then waited
    forever on a thread stuck in a Ray call. Here the clean-up waits on an event nobody sets: the
    watchdog ends the process 2 s after the 1 s time-out, with a line naming the test and every
    thread's stack, the waiting frame among them."""
    (tmp_path / "test_hangs.py").write_text(
        "import threading, time\n\n\ndef test_hangs():\n    try:\n        time.sleep(30)\n"
        "    finally:\n        threading.Event().wait()  # the clean-up that never ends\n")
    began = time.monotonic()
    done = _pytest(tmp_path, "-o", "timeout=1", RAYDP_LLM_HUNG_GRACE_S="2")
    out = done.stdout + done.stderr
    assert done.returncode == 1 and time.monotonic() - began < 60, out
    assert "[budget] test_hangs.py::test_hangs has run 3 s: its time-out passed and its " \
           "clean-up did not end" in out, out
    # line 8, the clean-up's wait: pytest-timeout's alarm had ended the sleep of line 6
    assert 'File "' + str(tmp_path / "test_hangs.py") + '", line 8 in test_hangs' in out, out
    # the last line of all, which is what a CI log's tail shows
    assert done.stderr.rstrip().splitlines()[-1] == (
        "[budget] test_hangs.py::test_hangs has run 3 s: its time-out passed and its clean-up did "
        "not end (tests/fixtures/budget.py): the stacks above, the main thread's last"), out

