"""Where a command's CPU goes, by kind of process: the test suite's, as docs/benchmarks.md has it.

    python benchmarks/suite_cpu.py [--out FILE] -- make test

Runs the command and, once a second, reads every process's CPU time (``/proc`` through psutil),
sorted into kinds by its command line (Ray sets its workers' titles: ``ray::RayTrainWorker``,
``ray::IDLE``, ...). A process's last second before it exits is lost, and the sampler's own CPU
(about 1% of a core) is counted apart. Prints the wall time, the command's exit status and a
table of CPU seconds and processes by kind; exits with the command's status."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict

import psutil

# kind → a test on a process's command line (the first that matches wins)
KINDS = [
    ("Ray Train's workers", lambda c: "RayTrainWorker" in c),
    ("Ray Train's controllers, synchronization and state actors",
     lambda c: any(n in c for n in ("TrainController", "Synchronization", "TrainState"))),
    ("PySpark's Python workers", lambda c: "pyspark.daemon" in c or "pyspark.worker" in c),
    ("Spark drivers (JVM)", lambda c: "org.apache.spark.deploy.SparkSubmit" in c),
    ("RayDP app masters (JVM)", lambda c: "AppMasterEntryPoint" in c),
    ("Spark executors (JVM)", lambda c: c.split(" ", 1)[0].endswith("java")),
    ("Ray's dashboard and agents", lambda c: "dashboard" in c.lower()),
    ("Ray's log monitors", lambda c: "log_monitor" in c),
    ("Ray's idle workers", lambda c: "ray::IDLE" in c),
    ("other Ray actors and tasks", lambda c: c.startswith("ray::")),
    ("Ray's daemons (raylet, GCS, monitor)",
     lambda c: any(d in c for d in ("raylet", "gcs_server", "monitor.py", "runtime_env"))),
    ("pytest and its forks (in-process drivers)", lambda c: "pytest" in c),
    ("command-line jobs' drivers (python -m raydp_llm...)", lambda c: "raydp_llm." in c),
]
OTHER = "everything else (MLflow, moto, Java's tools, shells)"


def kind_of(cmdline: str) -> str:
    return next((kind for kind, test in KINDS if test(cmdline)), OTHER)


def sample(seen: dict, me: int) -> None:
    """Each process's CPU seconds and latest kind, by (pid, start time)."""
    for proc in psutil.process_iter(["pid", "create_time", "cmdline", "cpu_times"]):
        info = proc.info
        if info["pid"] == me or info["cpu_times"] is None:
            continue
        cmdline = " ".join(info["cmdline"] or [])
        cpu = info["cpu_times"].user + info["cpu_times"].system
        key = (info["pid"], info["create_time"])
        kind = kind_of(cmdline) if cmdline else seen.get(key, (0.0, OTHER))[1]
        seen[key] = (cpu, kind)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    before = {(p.pid, p.create_time()) for p in psutil.process_iter()}
    seen: dict = {}
    start = time.time()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        sample(seen, os.getpid())
        time.sleep(1.0)
    wall = time.time() - start
    totals, counts = defaultdict(float), defaultdict(int)
    for key, (cpu, kind) in seen.items():
        if key not in before:  # only what the command started
            totals[kind] += cpu
            counts[kind] += 1
    own = psutil.Process().cpu_times()
    lines = [f"{' '.join(command)}: exit {proc.returncode}, {wall:.0f} s wall, "
             f"{sum(totals.values()):.0f} s CPU (sampler: {own.user + own.system:.0f} s)",
             "", "| process | CPU s | processes |", "|---|---:|---:|"]
    lines += [f"| {kind} | {totals[kind]:.0f} | {counts[kind]} |"
              for kind in sorted(totals, key=totals.get, reverse=True)]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
