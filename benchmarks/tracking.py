"""MLflow tracking's cost on training: the same run with ``tracking=none`` and ``tracking=mlflow``
(a local SQLite store, logged from the driver), on the same machine, taken in turn.

    python benchmarks/tracking.py [--steps 600] [--evals 12] [--repeats 3]
                                  [--corpus ../shared/data/tinyshakespeare.txt]

The run is train_speed.py's trainer-2: nanoGPT's CPU baby GPT on the benchmark corpus, 2 DDP
workers, evaluated ``--evals`` times (each evaluation is one MLflow ``log_batch`` of every
metrics.csv column). The table shows, per setting, the median steady-state training tokens/s
(metrics.csv after the first report), the wall time of training (``train_s``: Ray Train's start,
the steps, the evaluations, the checkpoint) and of the whole command (``total_s``: with the MLflow
store's set-up and the artifacts' upload). The two go first in turn, round by round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from train_speed import run_one  # noqa: E402

KINDS = ("none", "mlflow")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps per run")
    parser.add_argument("--evals", type=int, default=12, help="evaluations (MLflow rows) per run")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the two settings")
    parser.add_argument(
        "--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as store:
        for repeat in range(args.repeats):
            order = list(runs.items())[::1 if repeat % 2 == 0 else -1]  # neither always goes first
            for kind, results in order:
                extra = [f"tracking={kind}", f"tracking.uri=sqlite:///{store}/mlflow.db",
                         f"train.eval_interval={args.steps // args.evals}"]
                results.append(run_one("trainer-2", args.corpus, args.steps, extra))
                print(f"  round {repeat + 1}: {kind:6} {results[-1]['tokens_per_s']:,.0f} "
                      f"tokens/s, train {results[-1]['train_s']:.1f} s", file=sys.stderr,
                      flush=True)
    base = statistics.median(r["tokens_per_s"] for r in runs["none"])
    print(f"\n{args.steps} steps, {args.evals} evaluations, 2 workers, median of {args.repeats}\n")
    print("| tracking | tokens/s | vs none | train_s | total_s | tokens/s per run |")
    print("|---|---:|---:|---:|---:|---|")
    for kind, results in runs.items():
        speed = statistics.median(r["tokens_per_s"] for r in results)
        train_s = statistics.median(r["train_s"] for r in results)
        total_s = statistics.median(r["total_s"] for r in results)
        each = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in results)
        print(f"| {kind} | {speed:,.0f} | {speed / base - 1:+.1%} | {train_s:.1f} | {total_s:.1f} "
              f"| {each} |")


if __name__ == "__main__":
    main()
