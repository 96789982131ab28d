"""What curation costs the ETL, and whether the driver stays flat: the same corpus through
``python -m raydp_llm.prepare`` with each curation setting, at several sizes.

    python benchmarks/curation.py [--mb 25,50,100] [--settings none,report,filters,exact,near]

The corpus is JSON Lines built from the benchmark corpus's words (``write_corpus``), with 5% exact
and 5% near duplicates planted. Settings (each a fresh process, char
tokenizer, 2 executors, no cache):

- ``none``: no curation (the contamination check off too): the baseline;
- ``report``: the contamination check counted (``data.decontaminate=report``);
- ``filters``: every Gopher filter at the paper's thresholds;
- ``exact``: ``data.dedup=exact``;
- ``near``: ``data.dedup=near`` with the filters.

The table: ETL seconds after Spark's start, the ratio to ``none``, documents kept, and the peak
resident memory of the driver (the Python process and the Spark driver JVM: ``memory.Sampler``
every 0.2 s):
with nothing per document brought to the driver it must not grow with the corpus.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_memory import Sampler  # noqa: E402 - the benchmarks' own helper, beside this file

ROOT = Path(__file__).resolve().parents[1]
FILTERS = ["data.filters.min_words=50", "data.filters.max_words=100000",
           "data.filters.max_non_alpha_words=0.2", "data.filters.max_symbol_word_ratio=0.1",
           "data.filters.max_dup_lines=0.3", "data.filters.max_dup_line_chars=0.2",
           "data.filters.max_top_2gram_chars=0.2", "data.filters.max_dup_5gram_chars=0.15"]
OFF = ["data.decontaminate=off"]  # each rule alone: the contamination check is the one setting
SETTINGS = {
    "none": OFF,
    "report": ["data.decontaminate=report"],
    "filters": [*OFF, *FILTERS],
    "exact": [*OFF, "data.dedup=exact"],
    "near": [*OFF, "data.dedup=near", *FILTERS],
}


def write_corpus(text: str, mb: float, path: Path, seed: int = 0) -> int:
    """About ``mb`` MB of JSON Lines documents, returns their count: words drawn from ``text``'s
    word frequencies in lines of 5-15 words, 50-500 words a document (a 1 MB source cut into
    stretches would repeat every 13-gram many times over: contamination everywhere), plus 5% exact
    copies (case changed) and 5% copies with three words replaced."""
    rng, docs, size = random.Random(seed), [], 0
    words = text.split()
    while size < mb * 1e6:
        roll = rng.random()
        if roll < 0.05 and docs:
            doc = rng.choice(docs).upper()
        elif roll < 0.10 and docs:
            edited = rng.choice(docs).split(" ")
            for i in rng.sample(range(len(edited)), min(3, len(edited))):
                edited[i] = "edited"
            doc = " ".join(edited)
        else:
            lines, left = [], rng.randint(50, 500)
            while left > 0:
                take = min(left, rng.randint(5, 15))
                lines.append(" ".join(rng.choices(words, k=take)))
                left -= take
            doc = "\n".join(lines)
        docs.append(doc)
        size += len(doc)
    with open(path, "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    return len(docs)


def run_prepare(setting: str, corpus: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "raydp_llm.prepare", f"data.path={corpus}", "data.format=jsonl",
           "data.cache=false", "tokenizer=char", f"hydra.run.dir={out}",
           "cluster.executors=2", "cluster.executor_cores=1", *SETTINGS[setting]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    sampler = Sampler(proc.pid, interval_s=0.2)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.stop()
    peaks = sampler.peaks()
    if proc.returncode:
        raise RuntimeError(f"{setting} failed:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    stats = json.loads((out / "etl_stats.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    return {"etl_s": sum(stats["phase_s"].values()), "phases": stats["phase_s"],
            "documents": manifest["documents"], "python_mb": peaks["driver"][0],
            "jvm_mb": peaks.get("spark driver JVM", (0.0,))[0], "curation": manifest["curation"]}


def compare_spark_ml(corpus: Path, tables: int) -> None:
    """Near duplicates two ways on one Spark session: this ETL's stage (``curate.near_duplicates``
    after exact) and Spark ML's ``MinHashLSH`` (word 5-grams, ``HashingTF``, ``tables`` hash
    tables, ``approxSimilarityJoin`` at Jaccard distance 0.2); seconds and documents found."""
    import time

    from pyspark.ml.feature import HashingTF, MinHashLSH, NGram, RegexTokenizer
    from pyspark.sql import functions as F

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.configs import make_config
    from raydp_llm.cli.inputs import check_inputs
    from raydp_llm.data.etl.curation import curate
    from raydp_llm.data.etl.records import EtlPlan
    from raydp_llm.data.etl.run import read_and_check
    from raydp_llm.engines.ray_cluster import ray_session
    from raydp_llm.engines.spark import spark_session

    cfg = make_config(f"data.path={corpus}", "data.format=jsonl", "data.dedup=near",
                      "data.decontaminate=off")
    with ray_session(cfg.cluster, "compare"), tempfile.TemporaryDirectory() as tmp, \
            spark_session(cfg.cluster, app_name="compare", log_dir=Path(tmp)) as spark:
        lines = read_and_check(spark, EtlPlan.of(cfg, check_inputs(cfg))).lines
        clock = time.perf_counter()
        curated = curate.curate(spark, lines, cfg.data, "line", cfg.seed)
        ours = {r.reason: r.n for r in curated.removed.groupBy("reason").agg(
            F.count("*").alias("n")).collect()}
        ours_s = time.perf_counter() - clock
        clock = time.perf_counter()
        docs = lines.select("src", F.col("raw").cast("string").alias("text"))
        words = RegexTokenizer(inputCol="text", outputCol="words", pattern="\\W+").transform(docs)
        grams = NGram(n=5, inputCol="words", outputCol="grams").transform(words)
        vectors = HashingTF(inputCol="grams", outputCol="v", numFeatures=1 << 22,
                            binary=True).transform(grams)
        vectors = vectors.where(F.size("grams") > 0).withColumn(
            "id", F.monotonically_increasing_id())
        model = MinHashLSH(inputCol="v", outputCol="h", numHashTables=tables, seed=1).fit(vectors)
        pairs = model.approxSimilarityJoin(vectors, vectors, 0.2, distCol="d").where(
            F.col("datasetA.id") < F.col("datasetB.id"))
        found = pairs.select("datasetB.id").distinct().count()
        ml_s = time.perf_counter() - clock
    print(f"\n| near duplicates | seconds | documents removed |\n|---|---:|---:|\n"
          f"| this ETL (exact, then MinHash LSH 14×9, verified, clusters) | {ours_s:.1f} | "
          f"{ours} |\n| Spark ML MinHashLSH ({tables} tables, approxSimilarityJoin; pairs, no "
          f"clusters) | {ml_s:.1f} | {found:,} (documents with an earlier near duplicate) |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", default="25,50,100", help="corpus sizes, MB of text")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated, of " + ", ".join(SETTINGS))
    parser.add_argument(
        "--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    parser.add_argument("--compare-spark-ml", type=float, default=None, metavar="MB",
                        help="instead: near duplicates by this ETL and by Spark ML's MinHashLSH")
    parser.add_argument("--tables", type=int, default=5, help="MinHashLSH hash tables")
    args = parser.parse_args()
    text, rows = args.corpus.read_text(), []
    if args.compare_spark_ml:
        with tempfile.TemporaryDirectory() as tmp:
            corpus = Path(tmp) / "corpus.jsonl"
            write_corpus(text, args.compare_spark_ml, corpus)
            compare_spark_ml(corpus, args.tables)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for mb in map(float, args.mb.split(",")):
            corpus = Path(tmp) / f"corpus{mb:g}.jsonl"
            docs = write_corpus(text, mb, corpus)
            for setting in args.settings.split(","):
                r = run_prepare(setting, corpus, Path(tmp) / f"run-{mb:g}-{setting}")
                rows.append((mb, docs, setting, r))
                print(f"  {mb:g} MB {setting}: {r['etl_s']:.1f} s {r['phases']}", file=sys.stderr,
                      flush=True)
    print("\n| MB | documents | setting | ETL s | vs none | kept | driver Python MiB | "
          "driver JVM MiB |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    base = {mb: r["etl_s"] for mb, _, setting, r in rows if setting == "none"}
    for mb, docs, setting, r in rows:
        ratio = f"{r['etl_s'] / base[mb]:.2f}×" if mb in base else "-"
        print(f"| {mb:g} | {docs:,} | {setting} | {r['etl_s']:.1f} | {ratio} | "
              f"{r['documents']:,} | {r['python_mb']:.0f} | {r['jvm_mb']:.0f} |")
    for mb, _, setting, r in rows:
        print(f"\n{mb:g} MB {setting}: {json.dumps(r['curation'])}")


if __name__ == "__main__":
    main()
