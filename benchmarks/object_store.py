"""Training on a dataset larger than Ray's object store (``data.cache=false``: the chunks handed
from Spark to Ray): Ray spills what does not fit to disk, and each worker fetches (restores) only
the blocks of its own chunks. Against the same run with an object store that holds the dataset
(nothing spilled), in one run; the spilled run must finish with the same reads per worker.

    python benchmarks/object_store.py [--copies 8]

The corpus: ``--copies`` files of tinyshakespeare ten times over (8: 89 MB of text, ~178 MB of
uint16 tokens: twice the 80 MB object store, Ray's minimum being 75 MiB); ``+experiment=smoke``'s
model, 20 steps. Each run is a fresh ``python -m raydp_llm.train`` with its own embedded Ray.
(This was ``tests/integration/test_streaming.py``; it checks the same, as a benchmark: 90 s of the
suite's budget.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
SMALL_STORE_MB, LARGE_STORE_MB = 80, 1024  # Ray's minimum is 75 MiB
# 2 MB blocks: a few dozen hand-off tasks (each ~0.15 s on 2 cores), still many more than a worker
# reads in 20 steps
CHUNK_TOKENS = 2**20
STEPS, BATCH, LANES_PER_CHUNK_OR_TWO = 20, 16, 16


def run(corpus: Path, store_mb: int, out: Path) -> dict:
    """One training command; its summary, with its wall time."""
    # Ray refuses to spill once its disk is 95% full, and machines' disks have been that full with
    # gigabytes left: the run spills ~100 MB, so only a really full disk may stop it.
    env = os.environ | {"RAY_local_fs_capacity_threshold": "1"}
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "raydp_llm.train", "+experiment=smoke", f"data.path={corpus}",
         "data.max_files=null", "data.cache=false", "data.decontaminate=off",
         f"cluster.object_store_mb={store_mb}", f"data.chunk_tokens={CHUNK_TOKENS}",
         f"train.max_steps={STEPS}", f"train.eval_interval={STEPS}", "train.eval_batches=2",
         "sample.max_new_tokens=5", f"hydra.run.dir={out}"],
        capture_output=True, text=True, timeout=900, cwd=out.parent, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"the run with a {store_mb} MB object store failed:\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return summary | {"wall_s": time.time() - started}


def check_spilled(summary: dict) -> None:
    """What the test asserted: the dataset is twice the object store, the run finished, and each
    worker fetched only its own lanes' chunks (8 lanes of 16, each within one chunk or crossing
    into the next in 20 steps)."""
    assert summary["etl"]["token_bytes_stored"] > 2 * SMALL_STORE_MB * 2**20
    assert summary["status"] == "finished" and summary["steps"] == STEPS
    assert 0 < summary["chunks_read_per_worker"] <= LANES_PER_CHUNK_OR_TWO
    assert LANES_PER_CHUNK_OR_TWO < summary["etl"]["chunks_train"]
    assert summary["windows_read_per_worker"] == STEPS * BATCH // 2


def row(name: str, store_mb: int, summary: dict) -> str:
    startup = summary["startup"]
    return (f"| {name} | {store_mb} | {summary['etl']['token_bytes_stored'] / 2**20:.0f} | "
            f"{startup['etl_s']:.1f} | {startup['command_to_first_step_s']:.1f} | "
            f"{summary['tokens_per_s']:,.0f} | {summary['chunks_read_per_worker']} | "
            f"{summary['wall_s']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raydp_llm_store_") as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        text = CORPUS.read_bytes()
        for i in range(args.copies):
            (corpus / f"copies{i}.txt").write_bytes(text * 10)
        spilled = run(corpus, SMALL_STORE_MB, Path(tmp) / "spilled")
        check_spilled(spilled)
        held = run(corpus, LARGE_STORE_MB, Path(tmp) / "held")
    print("| run | object store MB | tokens stored MB | ETL + hand-off s | command to first step s "
          "| tokens/s | chunks read per worker | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(row("held (baseline)", LARGE_STORE_MB, held))
    print(row("spilled", SMALL_STORE_MB, spilled))
    print("checked: the spilled run's dataset is over twice its object store, it finished, and "
          "each worker read only its own chunks")


if __name__ == "__main__":
    main()
