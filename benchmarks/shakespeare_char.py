"""Quality at nanoGPT's budget: ``+experiment=shakespeare_char`` (the own GPT) and
``+experiment=shakespeare_llama`` (transformers' Llama at the same parameter count) end to end,
over several seeds, against the bare loop in the same run.

    python benchmarks/shakespeare_char.py [--models gpt llama] [--seeds 3] [--no-bare]
                                          [--corpus ../shared/data/tinyshakespeare.txt]

nanoGPT's CPU "baby GPT" budget (char-level, block 64, batch 12, 4 layers, 4 heads, n_embd 128,
dropout 0; lr 1e-3, warmup 100, cosine to 1e-4 over 2000 steps) on tinyshakespeare: first 90%
training, last 10% validation; training windows at seeded random offsets (``data.sampling=random``),
as nanoGPT's ``get_batch`` draws them.
  gpt        ``python -m raydp_llm.train +experiment=shakespeare_char seed=S`` in a fresh process
             (Ray Train, 2 DDP workers); validation loss on the whole validation split at step
             2000, the whole command's wall time and the training tokens/s
  llama      the same with ``+experiment=shakespeare_llama`` (RoPE, RMSNorm, SwiGLU; 0.80M
             parameters against the GPT's 0.80M)
  bare       the GPT's model and schedule in one plain PyTorch process (bare_loop.py, seed 1337),
             validated on the same validation windows
Seeds 1337, 1338, ... (``--seeds``); the models take turns within each seed, so a slow spell of a
shared machine hits both. The ETL cache is shared by the runs: the first run of each seed is a
miss (the seed is part of the cache key), the other model's run a hit.
Targets: llama's validation loss ≤ 1.70 (mean of 3 seeds); the GPT's within 0.01 of the bare
loop's.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bare_loop import train_bare  # noqa: E402

EXPERIMENTS = {"gpt": "shakespeare_char", "llama": "shakespeare_llama"}
FIRST_SEED = 1337


def run_raydp_llm(corpus: Path, cache_dir: Path, model: str, seed: int,
                  extra: list[str]) -> dict:
    """One ``python -m raydp_llm.train`` of ``model``'s experiment: the last row of its
    metrics.csv (step 2000), the wall time and the mean training tokens/s after the first row."""
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "raydp_llm.train", f"+experiment={EXPERIMENTS[model]}",
             f"seed={seed}", f"data.path={corpus}", f"data.cache_dir={cache_dir}",
             "train.resume=never", f"hydra.run.dir={tmp}", *extra],
            capture_output=True, text=True, cwd=ROOT,
        )
        wall = time.perf_counter() - t
        if proc.returncode:
            raise RuntimeError(f"{model} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        with (Path(tmp) / "metrics.csv").open() as f:
            rows = list(csv.DictReader(f))
    last = rows[-1]
    return {"step": int(last["step"]), "val_loss": float(last["val_loss"]), "wall_s": wall,
            "tokens_per_s": sum(float(r["tokens_per_s"]) for r in rows[1:]) / len(rows[1:])}


def print_runs(runs: dict[str, list[dict]], seeds: list[int], bare: dict | None) -> None:
    """A row per model and seed."""
    print("\n| model | seed | val loss @2000 | wall s (incl. start-up) | train tokens/s |"
          "\n|---|---:|---:|---:|---:|")
    for model, results in runs.items():
        for seed, r in zip(seeds, results):
            print(f"| {model} | {seed} | {r['val_loss']:.4f} | {r['wall_s']:.0f} | "
                  f"{r['tokens_per_s']:,.0f} |")
    if bare:
        print(f"| bare PyTorch loop (GPT) | {FIRST_SEED} | {bare['val_loss']:.4f} | "
              f"{bare['wall_s']:.0f} | {bare['tokens_per_s']:,.0f} |")


def print_summary(runs: dict[str, list[dict]], bare: dict | None) -> None:
    """Per model: mean, spread (max − min) and standard deviation of the validation loss, the
    mean tokens/s, and both against the GPT's (and the bare loop's)."""
    base = runs.get("gpt")
    base_loss = statistics.mean(r["val_loss"] for r in base) if base else None
    base_speed = statistics.mean(r["tokens_per_s"] for r in base) if base else None
    print("\n| model | seeds | val loss mean | spread (max − min) | std | − gpt's | "
          "− bare's | train tokens/s (mean) | ÷ gpt's |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model, results in runs.items():
        losses = [r["val_loss"] for r in results]
        mean, speed = statistics.mean(losses), statistics.mean(r["tokens_per_s"] for r in results)
        std = statistics.stdev(losses) if len(losses) > 1 else 0.0
        vs_gpt = f"{mean - base_loss:+.4f}" if base else "-"
        vs_bare = f"{mean - bare['val_loss']:+.4f}" if bare else "-"
        ratio = f"{speed / base_speed:.2f}" if base else "-"
        print(f"| {model} | {len(losses)} | {mean:.4f} | {max(losses) - min(losses):.4f} | "
              f"{std:.4f} | {vs_gpt} | {vs_bare} | {speed:,.0f} | {ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    )
    parser.add_argument("--models", nargs="+", default=list(EXPERIMENTS), choices=EXPERIMENTS)
    parser.add_argument("--seeds", type=int, default=3, help=f"seeds {FIRST_SEED}, "
                                                             f"{FIRST_SEED + 1}, ...")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare loop")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for every run, e.g. --set optim.lr=2e-3")
    args = parser.parse_args()
    seeds = [FIRST_SEED + i for i in range(args.seeds)]
    runs: dict[str, list[dict]] = {model: [] for model in args.models}
    with tempfile.TemporaryDirectory() as cache_dir:
        for seed in seeds:
            for model in args.models:
                r = run_raydp_llm(args.corpus, Path(cache_dir), model, seed, args.set)
                runs[model].append(r)
                print(f"  {model} seed {seed}: val loss {r['val_loss']:.4f} in "
                      f"{r['wall_s']:.0f}s, {r['tokens_per_s']:,.0f} tokens/s", file=sys.stderr,
                      flush=True)
    bare = None if args.no_bare else train_bare(args.corpus, 2000, evaluate=True)
    if bare:
        print(f"  bare: val loss {bare['val_loss']:.4f} in {bare['wall_s']:.0f}s", file=sys.stderr,
              flush=True)
    print_runs(runs, seeds, bare)
    print_summary(runs, bare)


if __name__ == "__main__":
    main()
