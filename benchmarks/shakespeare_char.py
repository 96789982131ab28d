"""Quality at nanoGPT's budget: ``+experiment=shakespeare_char`` end to end, against the bare loop
in the same run.

    python benchmarks/shakespeare_char.py [--corpus ../shared/data/tinyshakespeare.txt]

nanoGPT's CPU "baby GPT" (char-level, block 64, batch 12, 4 layers, 4 heads, n_embd 128, dropout 0;
lr 1e-3, warmup 100, cosine to 1e-4 over 2000 steps) on tinyshakespeare: first 90% training, last
10% validation; training windows at seeded random offsets (``data.sampling=random``), as nanoGPT's
``get_batch`` draws them.
  raydp_llm  ``python -m raydp_llm.train +experiment=shakespeare_char`` in a fresh process, twice:
             an ETL cache miss (Ray and Spark start-up, the Spark ETL) and a hit (Spark not
             started); Ray Train with 2 DDP workers; validation loss on the whole validation split
             at step 2000, and the whole command's wall time
  bare       the same model and schedule in one plain PyTorch process (bare_loop.py), validated on
             the same validation windows
Targets: validation loss within 0.01 of the bare loop's (or better); the whole run's wall ÷ the
bare loop's ≤ 1.15.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from bare_loop import train_bare  # noqa: E402


def run_raydp_llm(corpus: Path, cache_dir: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "raydp_llm.train",
                "+experiment=shakespeare_char",
                f"data.path={corpus}",
                f"data.cache_dir={cache_dir}",
                "train.resume=never",
                f"hydra.run.dir={tmp}",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        wall = time.perf_counter() - t
        if proc.returncode:
            raise RuntimeError(f"raydp_llm failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        with (Path(tmp) / "metrics.csv").open() as f:
            rows = list(csv.DictReader(f))
    last = rows[-1]
    return {"step": int(last["step"]), "val_loss": float(last["val_loss"]), "wall_s": wall,
            "tokens_per_s": sum(float(r["tokens_per_s"]) for r in rows[1:]) / len(rows[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    )
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        for name in ("raydp_llm, ETL cache miss", "raydp_llm, ETL cache hit"):
            results[name] = run_raydp_llm(args.corpus, Path(cache_dir))
            print(f"  {name}: val loss {results[name]['val_loss']:.4f} in "
                  f"{results[name]['wall_s']:.0f}s", file=sys.stderr, flush=True)
    bare = results["bare PyTorch loop"] = train_bare(args.corpus, 2000, evaluate=True)
    print(f"  bare: val loss {bare['val_loss']:.4f} in {bare['wall_s']:.0f}s", file=sys.stderr,
          flush=True)
    print("\n| pipeline | val loss @2000 | − bare's | wall s (incl. start-up) | ÷ bare's | "
          "train tokens/s |\n|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['val_loss']:.4f} | {r['val_loss'] - bare['val_loss']:+.4f} | "
              f"{r['wall_s']:.0f} | {r['wall_s'] / bare['wall_s']:.2f} | "
              f"{r['tokens_per_s']:,.0f} |")


if __name__ == "__main__":
    main()
