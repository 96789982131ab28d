"""The entry points run as a user runs them: ``python -m raydp_llm.<entry> ...`` in a fresh process,
from the checkout, with the environment the test session began with (``USER_ENV``).

The test process is no such place: it seeds torch, and its engines change its environment as they
start (Ray's settings, ``JAVA_HOME``, ``SPARK_LOCAL_IP``, ``MASTER_ADDR``), which a child would
inherit. A command-line LoRA run once failed at its export for every user while the in-process
tests passed: their helper had seeded torch. Each family of paths (plain, LoRA, FSDP, DPO,
mixture, tasks, batch answers) has at least one test that runs it this way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.configs import CACHE_DIR, NO_CHECK, SHORT_SAMPLE
from helpers.paths import ROOT

# Taken as the tests are collected, before any engine starts; the S3 stand-in's fake credentials
# (fixtures/s3.py, set as the plugins load) are in it, as a user's AWS credentials would be.
USER_ENV = dict(os.environ)
# The entry points that start an embedded Ray. The tests' runs of them start it without its
# dashboard unless a test gives cluster.dashboard: seconds of each run's start, and the dashboard's
# process beside the run (docs/benchmarks.md, "The test suite, issue 66 continued"); the dashboard
# is tested where it is watched (test_monitoring.py).
WITH_RAY = {"raydp_llm.train", "raydp_llm.evaluate", "raydp_llm.prepare"}


def _args(module: str, args: tuple[str, ...]) -> list[str]:
    """``args``, with cluster.dashboard=false last where ``module`` starts a Ray (last: Hydra's
    flags may come anywhere before it) and the test did not set it."""
    given = any(a.startswith(("cluster.dashboard=", "cluster.address=")) for a in args)
    return [*args] if module not in WITH_RAY or given else [*args, "cluster.dashboard=false"]


def start(module: str, *args: str, cwd: Path = ROOT, env: dict | None = None
          ) -> subprocess.Popen:
    """``python -m module args`` started in its own session (a test can kill it and all it
    started), its output (stdout and stderr together) piped; ``env`` is added to the user's."""
    return subprocess.Popen([sys.executable, "-m", module, *_args(module, args)], cwd=cwd,
                            env=USER_ENV | (env or {}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def run(module: str, *args: str, cwd: Path = ROOT, timeout: float = 900
        ) -> subprocess.CompletedProcess:
    """``python -m module args`` to its end; its output captured."""
    return subprocess.run([sys.executable, "-m", module, *_args(module, args)], cwd=cwd,
                          env=USER_ENV,
                          capture_output=True, text=True, timeout=timeout)


def train(out: Path, *overrides: str, timeout: float = 900) -> dict:
    """``python -m raydp_llm.train overrides`` into ``out`` (``hydra.run.dir``), on the tests' ETL
    cache, the contamination check off and a short sample unless the overrides say otherwise (as
    ``helpers.configs.make_config`` does in process); its summary.json. Its console (stdout and
    stderr) goes beside ``out``, as ``<out>.console``. Fails with the command's output when it does
    not succeed."""
    given = {o.split("=")[0] for o in overrides}
    defaults = [d for d in (f"data.cache_dir={CACHE_DIR}", NO_CHECK, SHORT_SAMPLE)
                if d.split("=")[0] not in given]
    done = run("raydp_llm.train", *defaults, *overrides, f"hydra.run.dir={out}", timeout=timeout)
    out.with_name(out.name + ".console").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())
