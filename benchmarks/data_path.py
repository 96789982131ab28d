"""The data path: what the token-stream layout stores and reads, against the window layout it
replaced (measured in the same run, on the same ETL output).

    python benchmarks/data_path.py [--corpus ../shared/data/tinyshakespeare.txt] [--block 64]
                                   [--startup]

One char-level ETL of the corpus (first 90% training, last 10% validation) into a fresh cache, then:
  bytes per token  the chunks on disk (Parquet files) per training token, at strides 1, 16 and the
                   block; baseline: the old layout, every window stored as ``block + 1`` uint16 ids
                   (Parquet's own overhead left out, so the baseline is a lower bound)
  reads            windows and chunks each worker reads in one epoch at stride 1 with 1 and 2
                   workers (worker.WorkerData over the cache's Parquet files); baseline: the old
                   trainer, where every worker read every window of the epoch
  resume           seconds from a fresh worker to the first batch of a step at 10% and 90% of an
                   epoch (stride 1); baseline: reading through the steps before it, as the old
                   trainer skipped them
  start-up         (--startup) ``python -m raydp_llm.train +experiment=smoke`` on a cache miss then
                   a hit: summary.json's start-up phases; baseline: a miss with
                   ``cluster.quick_jvm=false`` (C2 in Spark's JVMs, as before)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BATCH = 12


def prepare(corpus: Path, block: int, out: Path):
    """The ETL output in a fresh cache, and the settings of a run on it."""
    from hydra import compose, initialize_config_dir

    from raydp_llm.cli.inputs import check_inputs, typed_settings
    from raydp_llm.core.registry import register_configs
    from raydp_llm.data.prepare import prepared
    from raydp_llm.engines.ray_cluster import ray_session

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = typed_settings(compose(config_name="config", overrides=[
            "+experiment=shakespeare_char", f"data.path={corpus}", f"data.cache_dir={out}/cache",
            f"model.block_size={block}", f"train.batch_size={BATCH}", "data.decontaminate=off"]))
    with ray_session(cfg.cluster, cfg.name):
        with prepared(cfg, check_inputs(cfg), out, to_ray=True, store=Path(f"{out}/cache")) as d:
            return cfg, d


def bytes_per_token(cfg, data) -> list[dict]:
    from raydp_llm.data.stream import Sampling

    disk = sum(f.stat().st_size for split in ("train", "val")
               for f in (data.entry / split).glob("*.parquet"))
    tokens, block = data.manifest.tokens, cfg.model.block_size
    rows = []
    for stride in (1, 16, block):
        windows = sum(int(Sampling(block, stride).counts(data.index[s]).sum())
                      for s in ("train", "val"))
        rows.append({"stride": stride, "chunks": disk / tokens,
                     "windows": windows * (block + 1) * 2 / tokens})
    return rows


def spec_of(cfg, data, stride: int):
    from raydp_llm.training.spec import build_spec, samplings, windows_of

    cfg = replace(cfg, data=replace(cfg.data, stride=stride, sampling="stride"))
    windows = windows_of(cfg, data.index, data.manifest)
    return build_spec(cfg, data.tokenizer, data.manifest, windows, samplings(cfg))


def worker_data(spec, data, rank: int, world: int):
    from raydp_llm.training.objectives.windows import WorkerData

    sources = data.splits()
    return WorkerData(spec, sources, rank, world)


def reads(cfg, data) -> list[dict]:
    spec = spec_of(cfg, data, stride=1)
    windows = spec.steps_per_epoch * BATCH
    rows = []
    for world in (1, 2):
        per_worker = []
        for rank in range(world):
            worker = worker_data(spec, data, rank, world)
            for _ in worker.steps(epoch=0, first_step=0):
                pass
            per_worker.append(worker.readers["train"].counts())
        rows.append({"workers": world, "epoch_windows": windows,
                     "windows_read": max(c["windows_read"] for c in per_worker),
                     "chunks_read": max(c["chunks_read"] for c in per_worker),
                     "chunks": len(data.index["train"]), "old_windows_read": windows})
    return rows


def resume(cfg, data) -> list[dict]:
    from raydp_llm.data.stream import EpochOrder

    spec = spec_of(cfg, data, stride=1)
    rows = []
    for fraction in (0.1, 0.9):
        step = int(spec.steps_per_epoch * fraction)
        t = time.perf_counter()
        next(worker_data(spec, data, 0, 1).steps(epoch=0, first_step=step))
        seek_s = time.perf_counter() - t
        t = time.perf_counter()
        worker = worker_data(spec, data, 0, 1)
        reader = worker.readers["train"]
        order = EpochOrder(reader.index, spec.sampling["train"], spec.seed, 0)
        for s in range(step + 1):  # the old way: every window before the step read and dropped
            reader.windows(order, worker.lanes.positions(s, spec.steps_per_epoch))
        rows.append({"fraction": fraction, "step": step, "seek_s": seek_s,
                     "read_through_s": time.perf_counter() - t})
    return rows


# (run, cache directory, extra settings): the baseline is a miss with C2 in Spark's JVMs
STARTUP_RUNS = (("miss, cluster.quick_jvm=false", "c2", ["cluster.quick_jvm=false"]),
                ("miss", "c1", []), ("hit", "c1", []))


def startup(corpus: Path) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (run, cache, extra) in enumerate(STARTUP_RUNS):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "raydp_llm.train", "+experiment=smoke",
                            f"data.path={corpus}", "data.max_files=null",
                            f"data.cache_dir={tmp}/{cache}", "train.max_steps=50",
                            "train.eval_interval=50", f"hydra.run.dir={tmp}/{i}",
                            "data.decontaminate=off", *extra],
                           check=True, capture_output=True, cwd=ROOT)
            summary = json.loads(Path(f"{tmp}/{i}/summary.json").read_text())
            rows.append({"run": run, "wall_s": time.perf_counter() - t, **summary["startup"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path,
                        default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--startup", action="store_true", help="also time two whole runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg, data = prepare(args.corpus, args.block, Path(tmp))
        print(f"\n{data.manifest.tokens:,} tokens, {len(data.index['train'])} training chunks, "
              f"block {args.block}\n\n| stride | chunks (B/token, on disk) | windows layout "
              "(B/token, ≥) | ratio |\n|---|---|---|---|")
        for r in bytes_per_token(cfg, data):
            print(f"| {r['stride']} | {r['chunks']:.2f} | {r['windows']:.2f} | "
                  f"{r['windows'] / r['chunks']:.1f}× |")
        print("\n| workers | windows per epoch | windows read per worker (≤ windows/W) | chunks "
              "read per worker / chunks | old: windows read per worker |\n|---|---|---|---|---|")
        for r in reads(cfg, data):
            print(f"| {r['workers']} | {r['epoch_windows']:,} | {r['windows_read']:,} "
                  f"({r['windows_read'] * r['workers'] / r['epoch_windows']:.3f} × windows/W) | "
                  f"{r['chunks_read']} / {r['chunks']} | {r['old_windows_read']:,} |")
        print("\n| resume at | step | seek to it, s | old: read through, s |\n|---|---|---|---|")
        for r in resume(cfg, data):
            print(f"| {r['fraction']:.0%} | {r['step']:,} | {r['seek_s']:.3f} | "
                  f"{r['read_through_s']:.2f} |")
    if args.startup:
        rows = startup(args.corpus)
        keys = [k for k in rows[0] if k != "run" and not isinstance(rows[0][k], dict)]
        print("\n| run | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
        for r in rows:
            print(f"| {r['run']} | " + " | ".join(
                "-" if r[k] is None else f"{r[k]:.1f}" for k in keys) + " |")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
