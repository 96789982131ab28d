"""The README's experiments, each run as a user runs it: ``python -m raydp_llm.train
+experiment=NAME`` in a fresh process, twice on a fresh ``data.cache_dir`` (the first run's ETL a
cache miss, the second's a hit), timed from the command's start to its end; ``table`` on the
benchmark corpus as a Delta table, a row per speech. GRPO starts from the
second ``sums`` run's model, and ``evaluate`` scores that model and GRPO's on every sums prompt
(greedy, ``exact_match``), as docs/rl.md does. The README's "how long here" column is sourced from
this table (docs/benchmarks.md, "The README's experiments").

    python benchmarks/experiments.py [--only sums grpo dpo mixture ...] [--set key=value ...]

Prints a markdown table: the wall of each run, its phases from ``summary.json`` (Ray, Spark, the
ETL, training) and its figures (validation loss first → final; DPO's reward accuracy; GRPO's
held-out reward), then the exact-answer rates ``evaluate`` gave.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
# the experiments the README lists that run on the shipped sample or the benchmark corpus
NEEDS_CORPUS = {"shakespeare_bpe"}
ORDER = ["sums", "grpo", "dpo", "mixture", "table", "lstm_baseline", "shakespeare_bpe"]


def _speeches_table(work: Path) -> Path:
    """The benchmark corpus as a Delta table (``+experiment=table``): a row per speech (its
    paragraphs), written by ``deltalake`` in one commit."""
    import pyarrow as pa
    from deltalake import write_deltalake

    path = work / "speeches"
    speeches = [s for s in CORPUS.read_text().split("\n\n") if s.strip()]
    write_deltalake(path, pa.table({"text": speeches}))
    return path


def _run(args: list[str], log: Path) -> float:
    """``python -m args`` from the checkout, its output into ``log``; its wall seconds."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, stdout=out,
                              stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({done.returncode}): see {log}")
    return wall


def _figures(summary: dict) -> str:
    """The run's quality figures, as the README gives them."""
    parts = []
    if summary.get("first_val_loss") is not None:
        parts.append(f"val loss {summary['first_val_loss']:.4f} → "
                     f"{summary['final_val_loss']:.4f}")
    if summary.get("first_val_reward") is not None:
        parts.append(f"val_reward {summary['first_val_reward']:.3f} → "
                     f"{summary['final_val_reward']:.3f}")
    if summary.get("final_val_reward_accuracy") is not None:
        parts.append(f"reward accuracy {summary['final_val_reward_accuracy']:.3f}")
    return "; ".join(parts)


def _phases(summary: dict) -> str:
    """Ray's, Spark's, the ETL's and training's seconds from ``summary.json``."""
    names = {"ray_start_s": "Ray", "spark_start_s": "Spark", "etl_s": "ETL", "train_s": "training"}
    flat = {**summary, **summary.get("timings", {}), **summary.get("startup", {})}
    return ", ".join(f"{label} {flat[key]:.0f}" for key, label in names.items()
                     if isinstance(flat.get(key), (int, float)))


def _experiment(name: str, work: Path, extra: list[str], model: Path | None) -> list[dict]:
    """``name`` twice on one fresh cache: the miss, then the hit."""
    args = [f"+experiment={name}", f"data.cache_dir={work / 'cache'}", *extra]
    if name in NEEDS_CORPUS:
        args.append(f"data.path={CORPUS}")
    if name == "table":
        args.append(f"data.table={_speeches_table(work)}")
    if model is not None:
        args.append(f"model.path={model}")
    rows = []
    for attempt in ("not cached", "cached"):
        out = work / f"{name}-{len(rows)}"
        wall = _run(["raydp_llm.train", *args, f"hydra.run.dir={out}"], work / f"{out.name}.log")
        summary = json.loads((out / "summary.json").read_text())
        rows.append({"name": name, "etl": attempt, "wall": wall, "out": out,
                     "phases": _phases(summary), "figures": _figures(summary)})
    return rows


def _exact_rate(model: Path, prompts: str, work: Path) -> float:
    """``evaluate``'s mean ``exact_match`` over every sums prompt, greedy."""
    out = work / f"eval-{model.parent.name}"
    _run(["raydp_llm.evaluate", f"model_dir={model}", "data.format=prompts",
          f"data.path={prompts}", "grpo.rewards=[exact_match]", "grpo.max_new_tokens=8",
          f"hydra.run.dir={out}", f"data.cache_dir={work / 'cache'}"], work / f"{out.name}.log")
    return json.loads((out / "evaluation.json").read_text())["reward"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", default=ORDER, choices=ORDER)
    parser.add_argument("--set", nargs="*", default=[], help="overrides for every run")
    opts = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from raydp_llm.core.registry import sample_sums

    work = Path(tempfile.mkdtemp(prefix="experiments-"))
    rows, rates, sums_model = [], {}, None
    for name in [n for n in ORDER if n in opts.only]:
        if name == "grpo" and sums_model is None:
            sys.exit("grpo starts from the sums model: run it with --only sums grpo")
        rows += _experiment(name, work, opts.set, sums_model if name == "grpo" else None)
        if name in ("sums", "grpo"):
            model = rows[-1]["out"] / "model"
            rates[name] = _exact_rate(model, sample_sums("prompts"), work)
            sums_model = model if name == "sums" else sums_model
    print("| experiment | ETL | wall, s | phases, s | figures |")
    print("|---|---|---:|---|---|")
    for row in rows:
        print(f"| `{row['name']}` | {row['etl']} | {row['wall']:.0f} | {row['phases']} | "
              f"{row['figures']} |")
    for name, rate in rates.items():
        print(f"\n`evaluate` of the second `{name}` run's model: exact answers {rate:.1%} "
              "of the 4,000 prompts")


if __name__ == "__main__":
    main()
