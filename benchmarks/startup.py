"""Start-up: where the seconds from the command to the first step go, phase by phase, before and
after Ray Train's worker group started beside Spark and the ETL, measured in the same run.

    python benchmarks/startup.py [--baseline 7077e27] [--repeats 1] [--steps 20]
                                 [--set KEY=VALUE ...] [--shakespeare]

  before   the ``--baseline`` commit, checked out into a temporary ``git worktree`` and run with
           PYTHONPATH pointing there (its code; this interpreter and its packages)
  after    this tree
Each runs ``python -m raydp_llm.train train.max_steps=20`` (the baby GPT: model=gpt, the char
tokenizer, 2 DDP workers, the sample corpus) twice: a cache miss (a fresh ``data.cache_dir``),
then a cache hit on the same directory. The tables: summary.json's ``startup`` phases of each
(``-``: a phase the tree does not report), the command to the first step, and the wall time of the
whole command. Before and after take turns, ``--repeats`` rounds (the median of each), so that a
slow spell of a shared machine hits both.
``--shakespeare``: also ``+experiment=shakespeare_char`` (2000 steps) of each tree on the benchmark
corpus, beside nanoGPT's loop in one plain PyTorch process (bare_loop.py): wall times and ratios.
Targets: a miss's first step ≤ 30 s after the command; a 20-step hit ≤ 18 s wall;
shakespeare_char ≤ 1.35 × the bare loop's wall.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

BASELINE = "7077e27"  # the commit before the overlap
PHASES = ("python_start_s", "ray_start_s", "spark_start_s", "etl_s", "train_group_start_s",
          "data_wait_s", "worker_setup_s", "first_step_s", "train_group_stop_s", "overlapped_s",
          "command_to_first_step_s", "wall_s")


@contextlib.contextmanager
def baseline_tree(ref: str, parent: Path) -> Iterator[Path]:
    """``ref`` checked out (detached) into a temporary worktree under ``parent``; removed after."""
    tree = parent / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
                   check=True, capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=False, capture_output=True)


def train(tree: Path, out: Path, cache: Path, args: list[str]) -> dict:
    """One ``python -m raydp_llm.train`` of ``tree``'s code: its summary's startup phases, and the
    command's wall time."""
    env = os.environ | {"PYTHONPATH": str(tree)}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "raydp_llm.train", f"data.cache_dir={cache}",
                           "train.resume=never", f"hydra.run.dir={out}", *args],
                          capture_output=True, text=True, cwd=tree, env=env)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(f"{tree} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    startup = json.loads((out / "summary.json").read_text())["startup"]
    return {k: v for k, v in startup.items() if not isinstance(v, dict)} | {"wall_s": wall}


def measure(trees: dict[str, Path], tmp: Path, rounds: int, args: list[str]) -> dict:
    """``{(tree, "miss" | "hit"): [phases of each round]}``, the trees taking turns."""
    runs: dict = {}
    for r in range(rounds):
        for name, tree in trees.items():
            cache = tmp / f"cache-{name}-{r}"  # fresh: the first run is a miss
            for kind in ("miss", "hit"):
                phases = train(tree, tmp / f"{name}-{kind}-{r}", cache, args)
                runs.setdefault((name, kind), []).append(phases)
                print(f"  {name} {kind} {r + 1}/{rounds}: first step at "
                      f"{phases.get('command_to_first_step_s', float('nan')):.1f}s, wall "
                      f"{phases['wall_s']:.1f}s", file=sys.stderr, flush=True)
    return runs


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def print_table(runs: dict, kind: str) -> None:
    """A row per phase: before, after and the difference (medians)."""
    print(f"\n{kind}\n\n| phase, s | before | after | after − before |\n|---|---:|---:|---:|")
    for key in PHASES:
        before, after = median(runs["before", kind], key), median(runs["after", kind], key)
        if before is None and after is None:
            continue
        cells = ["-" if v is None else f"{v:.1f}" for v in (before, after)]
        diff = "-" if None in (before, after) else f"{after - before:+.1f}"
        print(f"| {key} | {cells[0]} | {cells[1]} | {diff} |")


def shakespeare(trees: dict[str, Path], tmp: Path, corpus: Path) -> None:
    """``+experiment=shakespeare_char`` of each tree beside the bare loop: wall times, ratios."""
    from bare_loop import train_bare

    walls = {}
    for name, tree in trees.items():
        t = time.perf_counter()
        train(tree, tmp / f"{name}-shakespeare", tmp / f"cache-{name}-shakespeare",
              ["+experiment=shakespeare_char", f"data.path={corpus}"])
        walls[name] = time.perf_counter() - t
    bare = train_bare(corpus, 2000, evaluate=True)["wall_s"]
    print("\n| shakespeare_char (2000 steps) | wall s | ÷ bare loop |\n|---|---:|---:|")
    for name, wall in walls.items():
        print(f"| {name} | {wall:.0f} | {wall / bare:.2f} |")
    print(f"| bare PyTorch loop | {bare:.0f} | 1.00 |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=BASELINE, help="the commit before (a git ref)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of before and after")
    parser.add_argument("--steps", type=int, default=20, help="train.max_steps of every run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for every run, e.g. --set cluster.dashboard=false")
    parser.add_argument("--shakespeare", action="store_true",
                        help="also +experiment=shakespeare_char beside the bare loop")
    parser.add_argument("--corpus", type=Path,
                        default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, baseline_tree(args.baseline, Path(tmp)) as base:
        trees = {"before": base, "after": ROOT}
        runs = measure(trees, Path(tmp), args.repeats, [f"train.max_steps={args.steps}",
                                                        *args.set])
        print(f"\nbefore: {args.baseline}; after: this tree; medians of {args.repeats} round(s)")
        for kind in ("miss", "hit"):
            print_table(runs, kind)
        if args.shakespeare:
            shakespeare(trees, Path(tmp), args.corpus)


if __name__ == "__main__":
    main()
