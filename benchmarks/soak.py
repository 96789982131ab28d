"""A long training run with the dashboard on: does any process' memory grow?

    python benchmarks/soak.py [--minutes 30] [--set key=value ...]

Runs ``python -m raydp_llm.train`` (the default baby GPT, 2 DDP workers, dashboard on, a checkpoint
at the evaluation nearest each 1000 steps) with enough steps to outlast ``--minutes``, samples every
process below it every 10 s, and after ``--minutes`` stops it with Ctrl-C (as a person would). The
baseline is the same run after its first two minutes (start-up done, the dataset loaded, the first
evaluation and checkpoint past): per role, the RSS of its largest process then, half-way and at the
end, the change from start to end and over the second half (a role that grows early and then levels
off grows little in the second half; a leak grows in both).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_memory import Sampler  # noqa: E402 - the benchmarks' own helper, beside this file

ROOT = Path(__file__).resolve().parents[1]
WARM_S = 120


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides for the run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "raydp_llm.train",
            "name=soak",
            "train.max_steps=1000000",
            "cluster.dashboard=true",
            f"hydra.run.dir={tmp}/run",
            *args.set,
        ]
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        sampler = Sampler(proc.pid, interval_s=10)
        sampler.start()
        deadline = time.monotonic() + args.minutes * 60
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(5)
        ended_early = proc.poll() is not None
        sampler.stop()  # before the stop: the last sample is of the running run
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
        steps = _last_step(Path(tmp) / "run" / "metrics.csv")
    if ended_early:
        raise SystemExit("the run ended before the soak did; see its train.log")
    elapsed = sampler.samples[-1][0]
    start, mid, end = sampler.at(WARM_S), sampler.at(elapsed / 2), sampler.samples[-1][1]
    print(f"\nsoak: {elapsed / 60:.1f} min, {steps} steps; RSS of each role's largest process "
          "(MiB)\n")
    print(f"| role (largest process) | at {WARM_S / 60:.0f} min | at {elapsed / 120:.0f} min | at "
          "the end | change | second half |\n|---|---:|---:|---:|---:|---:|")
    for role in sorted(set(start) & set(mid) & set(end)):
        a, m, b = start[role][0], mid[role][0], end[role][0]
        print(f"| {role} | {a:.0f} | {m:.0f} | {b:.0f} | {100 * (b - a) / a:+.1f}% | "
              f"{100 * (b - m) / m:+.1f}% |")


def _last_step(metrics_csv: Path) -> int:
    lines = metrics_csv.read_text().splitlines() if metrics_csv.exists() else []
    return int(float(lines[-1].split(",")[0])) if len(lines) > 1 else 0


if __name__ == "__main__":
    main()
