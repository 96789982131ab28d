"""What packing buys on chat data: the sample conversations (``+experiment=chat``) trained for the
same number of steps with ``data.packing=true`` and with one conversation per window (the baseline,
measured in the same run).

    python benchmarks/chat_packing.py [--steps 300]

Each case is a full run (``python -m raydp_llm.train``, its own Ray, Spark and ETL; the cache off).
The table gives, per case: the training windows of an epoch, the share of the stream that is
padding, the tokens the loss counts per window, training tokens/s (every token of a window, padding
included, costs the same), the trained tokens per second that gives, the final validation loss on
the assistant's tokens, and the training time. Packing should cost nothing per token and put
several conversations' worth of trained tokens in each window.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(packing: bool, steps: int, out: Path) -> dict:
    subprocess.run(
        [sys.executable, "-m", "raydp_llm.train", "+experiment=chat",
         f"data.packing={str(packing).lower()}", "data.cache=false", f"train.max_steps={steps}",
         f"train.eval_interval={steps}", f"train.checkpoint_interval={steps}",
         f"hydra.run.dir={out}"],
        cwd=ROOT, check=True, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    chat, etl = summary["etl"]["chat"], summary["etl"]
    trained_per_window = chat["tokens_trained"] / (etl["windows_train"] + etl["windows_val"])
    return {
        "windows": etl["windows_train"],
        "padding": chat["padding_tokens"] / etl["tokens"],
        "trained_per_window": trained_per_window,
        "tokens_per_s": summary["tokens_per_s"],
        "trained_per_s": summary["tokens_per_s"] / (etl["block_size"] + 1) * trained_per_window,
        "val_loss": summary["final_val_loss"],
        "train_s": summary["train_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {name: run(name == "packed", args.steps, Path(tmp) / name)
                for name in ("one per window", "packed")}
    base = rows["one per window"]
    print(f"{args.steps} steps of +experiment=chat (16 windows of 257 tokens a step), 2 workers\n")
    print("| case | windows/epoch | padding | trained tokens/window | tokens/s | trained tokens/s "
          "| val loss | train s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        gain = r["trained_per_s"] / base["trained_per_s"]
        print(f"| {name} | {r['windows']:,} | {r['padding']:.1%} | {r['trained_per_window']:.1f} "
              f"| {r['tokens_per_s']:,.0f} | {r['trained_per_s']:,.0f} ({gain:.2f}×) "
              f"| {r['val_loss']:.4f} | {r['train_s']:.0f} |")


if __name__ == "__main__":
    main()
