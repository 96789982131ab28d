"""A sweep's driver over hours: do its trials keep starting and ending? (issue 66; raydp_fixes 7)

    python benchmarks/sweep_soak.py [--minutes 120] [--stuck-after 10] [--set key=value ...]

Runs one sweep as a user runs it, ``python -m raydp_llm.train -m hydra/launcher=ray``, of short
smoke jobs (40 steps each, a learning rate a job, two trials at once) with more jobs than
``--minutes`` can hold, and reads its ``jobs.jsonl`` (each job's row as it ends) every 10 s. The
jobs differ in ``optim.lr`` alone, so that they share one ETL (the sweep's driver runs each
distinct data setting's ETL before the first trial, and ``seed`` is one: a seed a job was hours
of ETL before a trial started). The sweep's driver is one process for the whole soak: the
long-lived driver that, on Ray 2.60, once stopped hearing of the actors it created (a trial's
actor then never starts and the sweep waits forever).

No job ending for ``--stuck-after`` minutes is a *stuck sweep*: it prints the driver's core-worker
log lines about lost subscriptions and failed polls, stops the sweep with Ctrl-C and exits 1. At
``--minutes`` it stops the sweep with Ctrl-C (as a person would) and prints a line: jobs ended, by
status, the longest wait between two job ends and the slowest job."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ["+experiment=smoke", "train.max_steps=40", "train.eval_interval=20", "train.eval_batches=5",
       "sample.max_new_tokens=20", "cluster.num_cpus=4"]
# what a driver's core-worker log says when its actor notices stop (docs/reliability.md)
LOST = ("Subscription to Actor", "failed to poll", "GcsSubscriberPoll", "unsubscrib")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=120)
    parser.add_argument("--stuck-after", type=float, default=10)
    parser.add_argument("--set", nargs="*", default=[], help="more Hydra overrides for each job")
    args = parser.parse_args()
    jobs = max(8, int(args.minutes * 3))  # a job ends every ~30 s here: more than the soak holds
    rates = ",".join(f"{3e-3 * (1 + i / jobs):.6g}" for i in range(jobs))
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp) / "sweep"
        command = [sys.executable, "-m", "raydp_llm.train", "-m", "hydra/launcher=ray", *JOB,
                   *args.set, f"optim.lr={rates}", f"hydra.sweep.dir={sweep_dir}"]
        print(" ".join(command)[:300], "...", flush=True)
        began = time.time()
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
        stuck = watch(proc, sweep_dir / "jobs.jsonl", args.minutes * 60, args.stuck_after * 60)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
        rows = read_rows(sweep_dir / "jobs.jsonl")
        if stuck:
            print_lost_lines(began)
        report(rows, began, stuck)
    return 1 if stuck else 0


def watch(proc: subprocess.Popen, rows_file: Path, soak_s: float, stuck_s: float) -> bool:
    """Until the soak's end or the sweep's: True when no job has ended for ``stuck_s``."""
    began = last_end = time.monotonic()
    seen = 0
    while proc.poll() is None and time.monotonic() - began < soak_s:
        time.sleep(10)
        rows = read_rows(rows_file)
        if len(rows) > seen:
            seen, last_end = len(rows), time.monotonic()
            print(f"{(last_end - began) / 60:6.1f} min: {seen} jobs ended", flush=True)
        elif time.monotonic() - last_end > stuck_s:
            print(f"no job ended for {stuck_s / 60:g} minutes: the sweep is stuck", flush=True)
            return True
    return False


def read_rows(rows_file: Path) -> list[dict]:
    if not rows_file.is_file():
        return []
    return [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]


def print_lost_lines(began: float) -> None:
    """The lines of the newest Ray session's driver logs that tell a lost subscription."""
    sessions = [s for s in Path(tempfile.gettempdir(), "ray").glob("session_2*")
                if s.stat().st_mtime >= began]
    if not sessions:
        return
    for log in max(sessions).glob("logs/python-core-driver-*.log"):
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if any(mark in line for mark in LOST)]
        print(f"{log}: {len(lines)} lines about subscriptions and polls", *lines[-20:], sep="\n")


def report(rows: list[dict], began: float, stuck: bool) -> None:
    ends = sorted(time.mktime(time.strptime(r["ended"][:19], "%Y-%m-%dT%H:%M:%S")) for r in rows)
    gaps = [b - a for a, b in zip([began, *ends], ends)]
    statuses = {status: sum(r["status"] == status for r in rows) for status in
                sorted({r["status"] for r in rows})}
    slowest = max((r["wall_s"] for r in rows), default=0)
    print(f"sweep soak: {len(rows)} jobs ended in {(time.time() - began) / 60:.0f} minutes "
          f"({statuses}); the longest wait between job ends {max(gaps, default=0):.0f} s, the "
          f"slowest job {slowest:.0f} s; {'STUCK' if stuck else 'no stuck trial'}")


if __name__ == "__main__":
    sys.exit(main())
