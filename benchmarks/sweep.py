"""Sweeps: the same four jobs one after another (the embedded default), as Ray Tune trials side by
side (``hydra/launcher=ray``), and side by side with ASHA stopping the poor ones, measured in the
same run.

    python benchmarks/sweep.py [--steps 300] [--cpus 4] [--two-nodes] [--set KEY=VALUE ...]
    python benchmarks/sweep.py --optuna [--baseline COMMIT] [--trials 8] [--cpus 6]

Each is ``python -m raydp_llm.train -m +experiment=smoke optim.lr=<4 values>`` with
``cluster.num_cpus`` (room for two trials of smoke's 2 workers × 1 CPU on a Ray of 4) on one ETL
cache entry made before the first (every variant reads it: the table compares the training, not
the ETL). ``--two-nodes``: on the simulated two-node cluster of the multinode tests
(tests/helpers/two_node_cluster.py, ``--cpus`` / 2 logical CPUs a node) as on a real one: each
job runs its own ETL (no cache on a cluster; Spark in turns), checkpoints in a shared directory,
and the sequential sweep is ``hydra.launcher.concurrent=false``.
The table: each variant's wall time, its trial-steps (the steps its jobs trained, from
sweep_summary.csv), the jobs completed and stopped, and the best validation loss; the ratios
against the sequential sweep.

``--optuna``: ``hydra/sweeper=optuna`` with ASHA, ``--trials`` trials of smoke's settings over a
log-scale learning rate, on the simulated two-node cluster: this checkout's one Tuner (Tune's
OptunaSearch, a trial started as soon as room frees, ASHA over every trial) against the
synchronous batches of ``--baseline`` (the commit before issue 58: a Tuner and an ASHA per batch of
as many trials as the cluster runs at once), run from a git worktree of it in the same run, on the
same seed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RATES = "3e-3,1e-2,1e-3,1e-6"  # the last learns next to nothing: ASHA's to stop
SPACE = f"optim.lr={RATES}"
VARIANTS = {
    "sequential": [SPACE],
    "side by side": [SPACE, "hydra/launcher=ray"],
    "side by side, ASHA": [SPACE, "hydra/launcher=ray", "sweep.scheduler=asha",
                           "sweep.reduction_factor=2"],
}


BASELINE = "5722031"  # the commit before issue 58: Optuna in synchronous batches


def sweep(variant: list[str], steps: int, where: list[str], out: Path, extra: list[str],
          env: dict | None = None, checkout: Path = ROOT) -> dict:
    """One sweep (``variant``: its search space and how it runs) to its end on the Ray and the
    data ``where`` says, run from ``checkout``: its wall seconds and its summary's figures."""
    command = [sys.executable, "-m", "raydp_llm.train", "-m", "+experiment=smoke",
               f"train.max_steps={steps}", "train.eval_interval=50",
               f"sweep.grace_steps={steps // 6}", f"hydra.sweep.dir={out}",
               *where, *variant, *extra]
    began = time.time()
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, env=env)
    wall = time.time() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(variant) or 'sequential'} failed:\n{done.stderr[-3000:]}")
    with (out / "sweep_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["best_val_loss"]) for r in rows if r["best_val_loss"]]
    return {"wall_s": wall, "trial_steps": sum(int(float(r["steps"] or 0)) for r in rows),
            "completed": sum(r["status"] == "completed" for r in rows),
            "stopped": sum(r["status"] == "stopped" for r in rows), "best": min(losses)}


@contextlib.contextmanager
def two_nodes(cpus: int, tmp: Path):
    """The simulated two-node cluster: its address, and the environment that reaches it."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SPARK_LOCAL_IP")}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Unix sockets
    helper = subprocess.Popen([sys.executable, str(ROOT / "tests/helpers/two_node_cluster.py"),
                               str(cpus // 2)], cwd=ROOT, env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=(tmp / "two_nodes.log").open("w"))
    try:
        line = ""
        while not line.startswith("{"):  # its one JSON line, once both nodes are up
            line = helper.stdout.readline() or sys.exit("the two-node cluster did not start")
        yield json.loads(line)["address"], env
    finally:
        helper.stdin.write("stop\n")
        helper.stdin.close()
        helper.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--two-nodes", action="store_true",
                        help="on the simulated two-node cluster of the multinode tests")
    parser.add_argument("--set", nargs="*", default=[], help="more overrides, KEY=VALUE")
    parser.add_argument("--optuna", action="store_true",
                        help="Optuna: one asynchronous Tuner against --baseline's batches")
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sweep_bench_") as tmp:
        if args.optuna:
            results = optuna_search(args, Path(tmp))
        elif args.two_nodes:
            results = on_two_nodes(args, Path(tmp))
        else:
            results = embedded(args, Path(tmp))
    ray = "two nodes of" if args.two_nodes or args.optuna else "an embedded Ray of"
    jobs = f"{args.trials} Optuna trials" if args.optuna else "4 smoke jobs"
    print(f"{jobs} of {args.steps} steps, {ray} {args.cpus} CPUs\n")
    table(results)


def table(results: dict) -> None:
    """The Markdown table, each variant against the first."""
    base = next(iter(results.values()))
    print("| sweep | wall s | vs first | trial-steps | vs first | completed | stopped "
          "| best val loss |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['wall_s']:.0f} | {r['wall_s'] / base['wall_s']:.2f}× "
              f"| {r['trial_steps']} | {r['trial_steps'] / base['trial_steps']:.2f}× "
              f"| {r['completed']} | {r['stopped']} | {r['best']:.4f} |")


def embedded(args, tmp: Path) -> dict:
    """The variants on the embedded Ray, on one ETL cache entry made before them."""
    cache = str(tmp / "cache")
    subprocess.run([sys.executable, "-m", "raydp_llm.prepare", "+experiment=smoke",
                    f"data.cache_dir={cache}", f"hydra.run.dir={tmp / 'prepare'}"],
                   cwd=ROOT, check=True, capture_output=True)
    where = [f"cluster.num_cpus={args.cpus}", "cluster.dashboard=false",
             f"data.cache_dir={cache}"]
    return {name: sweep(v, args.steps, where, tmp / f"s{i}", args.set)
            for i, (name, v) in enumerate(VARIANTS.items())}


def on_two_nodes(args, tmp: Path) -> dict:
    """The variants on the simulated two-node cluster, each job's ETL its own."""
    variants = VARIANTS | {"sequential": [SPACE, "hydra.launcher.concurrent=false"]}
    with two_nodes(args.cpus, tmp) as (address, env):
        where = [f"cluster.address={address}", "data.cache=false",
                 f"train.storage_path={tmp / 'runs'}"]
        return {name: sweep(v, args.steps, where, tmp / f"s{i}", args.set, env)
                for i, (name, v) in enumerate(variants.items())}


def optuna_search(args, tmp: Path) -> dict:
    """The Optuna search of ``--baseline`` (a git worktree of it) and of this checkout, on one
    simulated two-node cluster, each job's ETL its own (no cache on a cluster)."""
    baseline = tmp / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(baseline), args.baseline],
                   cwd=ROOT, check=True, capture_output=True)
    search = ["optim.lr=tag(log,interval(1e-5,3e-2))", "hydra/launcher=ray",
              "hydra/sweeper=optuna", f"sweep.trials={args.trials}", "sweep.scheduler=asha",
              "sweep.reduction_factor=2"]
    try:
        with two_nodes(args.cpus, tmp) as (address, env):
            where = [f"cluster.address={address}", "data.cache=false",
                     f"train.storage_path={tmp / 'runs'}"]
            return {
                f"batches ({args.baseline})": sweep(search, args.steps, where, tmp / "s0",
                                                    args.set, env, baseline),
                "one Tuner, asynchronous": sweep(search, args.steps, where, tmp / "s1", args.set,
                                                 env),
            }
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT,
                       capture_output=True)


if __name__ == "__main__":
    main()
