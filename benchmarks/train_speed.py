"""Training speed: this Ray Train trainer against a bare PyTorch loop of the same model, on the same
machine.

    python benchmarks/train_speed.py [--steps 1000] [--repeats 3] [--corpus
    ../shared/data/tinyshakespeare.txt]
                                     [--kinds bare,trainer-1,trainer-2,nanogpt] [--nanogpt DIR]
                                     [--models gpt llama]
                                     [--set cluster.dashboard=false ...]

The model is nanoGPT's CPU "baby GPT" (char-level, block 64, batch 12, 4 layers, 4 heads, n_embd
128, dropout 0).
  bare       one process, all cores for torch, nanoGPT-style random batches from a numpy array
             (bare_loop.py)
  trainer-1  this trainer (Ray Train; windows at random offsets, cut from the ETL cache's chunks by
             the worker) with 1 worker holding all cores
  trainer-2  the same with 2 DDP workers of 1 core each
  nanogpt    nanoGPT's own train.py (a checkout given by ``--nanogpt DIR``; its README's CPU
             command for the baby GPT, ``--compile=False``), its per-iteration times
Tokens/s are steady-state training throughput: start-up, ETL and evaluations excluded (the trainer's
figure is its metrics.csv ``tokens_per_s`` after the first report). Each measurement runs in a fresh
process; the three are taken in turn ``--repeats`` times, so that a slow spell of a shared machine
hits all of them, and the table shows the median of each (and its ratio to the bare loop's median)
with the spread. ``--set`` passes Hydra overrides to the trainer runs (e.g. the dashboard off),
``--kinds`` picks the measurements.
``--models gpt llama`` takes each trainer measurement for the own GPT (``+experiment=
shakespeare_char``) and for transformers' Llama at the same parameter count (``+experiment=
shakespeare_llama``: 0.80M against 0.80M) in turn, and prints llama ÷ gpt (the medians' ratio and
each round's); the bare loop is the GPT's. The runs share one ETL cache (the first is a miss).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bare_loop import BATCH, MODEL, train_bare  # noqa: E402

EXPERIMENTS = {"gpt": "shakespeare_char", "llama": "shakespeare_llama"}
# nanoGPT README's "baby GPT" on a CPU, the same shape and batch as bare_loop.MODEL and BATCH
NANOGPT_FLAGS = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
                 "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12",
                 "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0"]


def measure_trainer(corpus: Path, steps: int, workers: int, out: Path, extra: list[str],
                    model: str = "gpt", cache: Path | None = None) -> dict:
    from hydra import compose, initialize_config_dir

    from raydp_llm.cli.inputs import typed_settings
    from raydp_llm.cli.train import run
    from raydp_llm.core.registry import register_configs
    from raydp_llm.training.driver.metrics import read_metrics

    cpus = os.cpu_count() // workers
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                f"+experiment={EXPERIMENTS[model]}",
                f"data.path={corpus}",
                f"data.cache_dir={cache or out / 'cache'}",
                f"train.num_workers={workers}",
                f"train.cpus_per_worker={cpus}",
                f"train.max_steps={steps}",
                f"train.eval_interval={steps // 4}",
                "train.eval_batches=2",
                f"train.checkpoint_interval={steps}",
                "sample.max_new_tokens=1",
                *extra,
            ],
        )
    summary = run(typed_settings(cfg), out / "run")
    rows = read_metrics(out / "run" / "metrics.csv")[1:]  # the first interval includes warm-up
    return {
        "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / len(rows),
        "train_s": summary["train_s"],
        "total_s": summary["total_s"],
    }


def measure_nanogpt(checkout: Path, corpus: Path, steps: int) -> dict:
    """nanoGPT's train.py for ``steps`` iterations, its data prepared from ``corpus`` (its
    prepare.py, 90/10 as here); tokens/s from the mean time of its iterations after the first 10%,
    those that held an evaluation left out (as the trainer's figure leaves them out)."""
    import re

    data = checkout / "data" / "shakespeare_char"
    if not (data / "train.bin").is_file():
        (data / "input.txt").write_bytes(corpus.read_bytes())
        subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
    every = max(steps // 2, 1)
    proc = subprocess.run([sys.executable, "train.py", *NANOGPT_FLAGS, f"--max_iters={steps}",
                           f"--lr_decay_iters={steps}", f"--eval_interval={every}"],
                          cwd=checkout, capture_output=True, text=True, check=True)
    times = [float(ms) for it, ms in re.findall(r"iter (\d+): loss \S+, time ([\d.]+)ms",
                                                proc.stdout)
             if int(it) >= steps // 10 and int(it) % every]
    return {"tokens_per_s": BATCH * MODEL.block_size * 1000 / statistics.mean(times)}


def run_one(kind: str, corpus: Path, steps: int, extra: list[str], model: str = "gpt",
            cache: Path | None = None, nanogpt: Path | None = None) -> dict:
    shared = ["--cache", str(cache)] if cache else []
    if kind == "nanogpt":
        if nanogpt is None:
            raise SystemExit("error: --kinds nanogpt needs --nanogpt DIR (a nanoGPT checkout)")
        return measure_nanogpt(nanogpt, corpus, steps)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, __file__, "--measure", kind, "--corpus", str(corpus),
                               "--steps", str(steps), "--out", tmp, "--model", model, *shared,
                               *[f"--set={o}" for o in extra]],
                              capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{kind} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three measurements")
    parser.add_argument(
        "--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    )
    parser.add_argument("--kinds", default="bare,trainer-1,trainer-2", help="the measurements, "
                                                                            "comma-separated")
    parser.add_argument("--models", nargs="+", default=["gpt"], choices=list(EXPERIMENTS),
                        help="the trainer measurements' models (the bare loop is the GPT)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for the trainer runs, e.g. --set "
                             "cluster.dashboard=false")
    parser.add_argument("--nanogpt", type=Path, metavar="DIR",
                        help="a nanoGPT checkout, for --kinds ...,nanogpt")
    parser.add_argument(
        "--measure", choices=["bare", "trainer-1", "trainer-2"], help=argparse.SUPPRESS
    )
    parser.add_argument("--model", default="gpt", choices=list(EXPERIMENTS),
                        help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def print_ratios(runs: dict[tuple[str, str], list[float]]) -> None:
    """llama ÷ gpt per trainer measurement: the medians' ratio and each round's."""
    print("\n| pipeline | llama ÷ gpt (medians) | per round |\n|---|---:|---|")
    for (model, kind), llama in runs.items():
        gpt = runs.get(("gpt", kind))
        if model != "llama" or gpt is None:
            continue
        rounds = ", ".join(f"{a / b:.2f}" for a, b in zip(llama, gpt))
        print(f"| {kind} | {statistics.median(llama) / statistics.median(gpt):.2f} | {rounds} |")


def main() -> None:
    args = parse_args()
    if args.measure:
        result = (
            train_bare(args.corpus, args.steps, evaluate=False)
            if args.measure == "bare"
            else measure_trainer(args.corpus, args.steps, int(args.measure[-1]), args.out,
                                 args.set, args.model, args.cache)
        )
        print(json.dumps(result))
        return

    kinds = args.kinds.split(",")
    runs = {("gpt", k): [] for k in ("bare", "nanogpt") if k in kinds}
    runs.update({(m, k): [] for k in kinds if k not in ("bare", "nanogpt") for m in args.models})
    with tempfile.TemporaryDirectory() as cache:
        for repeat in range(args.repeats):
            for (model, kind), results in runs.items():
                r = run_one(kind, args.corpus, args.steps, args.set, model, Path(cache),
                            args.nanogpt)
                results.append(r["tokens_per_s"])
                print(f"  round {repeat + 1}: {kind:9} {model:5} {results[-1]:,.0f} "
                      "tokens/s", file=sys.stderr, flush=True)
    bare = statistics.median(runs[("gpt", "bare")]) if ("gpt", "bare") in runs else None
    print(f"\n{os.cpu_count()} cores, {args.steps} steps of batch {BATCH} × block "
          f"{MODEL.block_size}, median of {args.repeats}\n")
    print("| pipeline | model | tokens/s (median) | vs bare | runs |\n|---|---|---:|---:|---|")
    for (model, kind), results in runs.items():
        median = statistics.median(results)
        ratio = f"{median / bare:.2f}×" if bare else "-"
        print(f"| {kind} | {model} | {median:,.0f} | {ratio} | "
              f"{', '.join(f'{r:,.0f}' for r in results)} |")
    if "llama" in args.models and "gpt" in args.models:
        print_ratios(runs)


if __name__ == "__main__":
    main()
