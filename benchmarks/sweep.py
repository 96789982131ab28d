"""Sweeps: the same four jobs one after another (the embedded default), as Ray Tune trials side by
side (``hydra/launcher=ray``), and side by side with ASHA stopping the poor ones, measured in the
same run.

    python benchmarks/sweep.py [--steps 300] [--cpus 4] [--set KEY=VALUE ...]

Each is ``python -m raydp_llm.train -m +experiment=smoke optim.lr=<4 values>`` with
``cluster.num_cpus`` (room for two trials of smoke's 2 workers × 1 CPU on a Ray of 4) on one ETL
cache entry made before the first (every variant reads it: the table compares the training, not
the ETL). The table: each variant's wall time, its trial-steps (the steps its jobs trained, from
sweep_summary.csv), the jobs completed and stopped, and the best validation loss; the ratios
against the sequential sweep.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RATES = "3e-3,1e-2,1e-3,1e-6"  # the last learns next to nothing: ASHA's to stop
VARIANTS = {
    "sequential": [],
    "side by side": ["hydra/launcher=ray"],
    "side by side, ASHA": ["hydra/launcher=ray", "sweep.scheduler=asha",
                           "sweep.reduction_factor=2"],
}


def sweep(variant: list[str], steps: int, cpus: int, cache: str, out: Path, extra: list[str]
          ) -> dict:
    """One sweep to its end: its wall seconds and its summary's figures."""
    command = [sys.executable, "-m", "raydp_llm.train", "-m", "+experiment=smoke",
               f"optim.lr={RATES}", f"train.max_steps={steps}", "train.eval_interval=50",
               f"sweep.grace_steps={steps // 6}", f"cluster.num_cpus={cpus}",
               "cluster.dashboard=false", f"data.cache_dir={cache}", f"hydra.sweep.dir={out}",
               *variant, *extra]
    began = time.time()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(variant) or 'sequential'} failed:\n{done.stderr[-3000:]}")
    with (out / "sweep_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["best_val_loss"]) for r in rows if r["best_val_loss"]]
    return {"wall_s": wall, "trial_steps": sum(int(float(r["steps"] or 0)) for r in rows),
            "completed": sum(r["status"] == "completed" for r in rows),
            "stopped": sum(r["status"] == "stopped" for r in rows), "best": min(losses)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--set", nargs="*", default=[], help="more overrides, KEY=VALUE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sweep_bench_") as tmp:
        cache = str(Path(tmp) / "cache")
        subprocess.run([sys.executable, "-m", "raydp_llm.prepare", "+experiment=smoke",
                        f"data.cache_dir={cache}", f"hydra.run.dir={Path(tmp) / 'prepare'}"],
                       cwd=ROOT, check=True, capture_output=True)
        results = {name: sweep(v, args.steps, args.cpus, cache, Path(tmp) / f"s{i}", args.set)
                   for i, (name, v) in enumerate(VARIANTS.items())}
    base = results["sequential"]
    print(f"4 smoke jobs of {args.steps} steps, a Ray of {args.cpus} CPUs\n")
    print("| sweep | wall s | vs sequential | trial-steps | vs sequential | completed | stopped "
          "| best val loss |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['wall_s']:.0f} | {r['wall_s'] / base['wall_s']:.2f}× "
              f"| {r['trial_steps']} | {r['trial_steps'] / base['trial_steps']:.2f}× "
              f"| {r['completed']} | {r['stopped']} | {r['best']:.4f} |")


if __name__ == "__main__":
    main()
