"""A 1 GB corpus through the ETL without running out of memory: peak RSS of every process, against a
100 MB corpus (the baseline, measured in the same run).

    python benchmarks/etl_1gb.py [--sizes 100 1000] [--corpus ../shared/data/tinyshakespeare.txt]

Each size: the benchmark corpus repeated into 8 files, then ``python -m raydp_llm.prepare`` in its
own process (char tokenizer, block 256, 2 executors of 1 core and 1 GiB heap, chunks written as
Parquet under the run directory), its process tree sampled every second. Prints the ETL time and,
per role (the driver, the Spark driver JVM, the executor JVMs, the executors' Python workers, Ray),
the peak RSS of its largest process and of its sum, and the 1 GB / 100 MB ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_memory import Sampler  # noqa: E402 - the benchmarks' own helper, beside this file

ROOT = Path(__file__).resolve().parents[1]
FILES = 8


def measure(corpus: Path, out: Path) -> dict:
    args = [sys.executable, "-m", "raydp_llm.prepare", f"data.path={corpus}", "data.cache=false",
            "model.block_size=256", "cluster.dashboard=false", f"hydra.run.dir={out}",
            "cluster.executors=2", "cluster.executor_cores=1",
            "data.decontaminate=off"]  # the ETL's own phases (the check: contamination.py)
    t = time.perf_counter()
    proc = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(proc.pid)
    sampler.start()
    output, _ = proc.communicate()
    sampler.stop()
    if proc.returncode:
        raise SystemExit(f"prepare failed:\n{output[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    stats = json.loads((out / "etl_stats.json").read_text())
    return {
        "wall_s": time.perf_counter() - t,
        "etl_s": sum(stats["phase_s"].values()),
        "tokens": manifest["tokens"],
        "chunks": manifest["chunks_train"] + manifest["chunks_val"],
        "peaks": sampler.peaks(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000], help="corpus sizes, "
                                                                                  "MB")
    parser.add_argument(
        "--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    )
    parser.add_argument("--tmp", type=Path, default=None, help="where the corpora and datasets go "
                                                               "(GBs)")
    args = parser.parse_args()
    text = args.corpus.read_text()
    results = {}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for mb in args.sizes:
            corpus = Path(tmp) / f"corpus_{mb}"
            corpus.mkdir()
            copies = max(1, round(mb * 1e6 / FILES / len(text.encode())))
            for i in range(FILES):
                (corpus / f"part{i}.txt").write_text(text * copies)
            size = sum(p.stat().st_size for p in corpus.iterdir()) / 1e6
            results[mb] = measure(corpus, Path(tmp) / f"run_{mb}") | {"mb": size}
            r = results[mb]
            print(f"  {size:.0f} MB: {r['wall_s']:.0f}s ({r['etl_s']:.0f}s ETL), {r['tokens']:,} "
                  "tokens",
                  file=sys.stderr, flush=True)
    roles = sorted({role for r in results.values() for role in r["peaks"]})
    base, top = results[args.sizes[0]], results[args.sizes[-1]]
    print(
        "\n| role | "
        + " | ".join(f"{r['mb']:.0f} MB: largest / sum MB" for r in results.values())
        + f" | {top['mb']:.0f} ÷ {base['mb']:.0f} MB (largest) |"
    )
    print("|---|" + "---:|" * (len(results) + 1))
    for role in roles:
        cells = [f"{r['peaks'].get(role, (0, 0))[0]:.0f} / {r['peaks'].get(role, (0, 0))[1]:.0f}"
                 for r in results.values()]
        ratio = top["peaks"].get(role, (0, 0))[0] / max(base["peaks"].get(role, (1, 1))[0], 1)
        print(f"| {role} | " + " | ".join(cells) + f" | {ratio:.2f}× |")
    print("\n| corpus MB | tokens | chunks | ETL s | wall s | MB/s "
          "|\n|---:|---:|---:|---:|---:|---:|")
    for r in results.values():
        print(f"| {r['mb']:.0f} | {r['tokens']:,} | {r['chunks']:,} | {r['etl_s']:.0f} | "
              f"{r['wall_s']:.0f} | {r['mb'] / r['etl_s']:.2f} |")


if __name__ == "__main__":
    main()
