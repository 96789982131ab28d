"""ETL benchmark: this Spark ETL (byte-level BPE, RayDP executors) against a single-process
baseline.

    python benchmarks/etl.py [--sizes 25 50 100] [--corpus ../shared/data/tinyshakespeare.txt]

For each corpus size (the benchmark corpus repeated into one file) it measures, each in a fresh
process:
  etl-2   this ETL with 2 executors: read, BPE trained on a Spark sample, encode in the executors,
          chunks of the token stream, train/val split, Parquet written; Spark/JVM start-up
          timed separately
  etl-1   the same with 1 executor (the scaling baseline) single  one process doing the same work
  the usual way: read the file, train the same BPE on a sample,
          tokenizers' encode_batch (all cores), numpy windows, pyarrow Parquet
and prints MB/s and tokens/s (start-up excluded), the ratios, and each driver's peak RSS.

    python benchmarks/etl.py --security [--sizes 50] [--repeats 2]

measures etl-2 with Spark's authentication and network encryption on (the default: docs/security.md)
and off (etl-2-open), alternately, and prints each one's ETL and start-up time against off.

    python benchmarks/etl.py --s3 [--sizes 50] [--repeats 2]

measures etl-2 with the ETL cache on a local S3 stand-in (moto on 127.0.0.1: etl-2-s3, the
executors writing the chunks through pyarrow, ``data/s3_cache.py``) and in a local directory
(etl-2), alternately: the write (the ETL's last phase, the seal and the commit) and a read of every
chunk as the training workers read them, each against local.

    python benchmarks/etl.py --table [--sizes 50] [--repeats 2]

measures etl-2 on a Delta table of the corpus's paragraphs (deltalake, four appends: four data
files; ``data.table``, ``data.format=parquet``: etl-2-table) and on the same Parquet files given
as ``data.path`` (etl-2-parquet), alternately, and prints each one's tokens/s against the files'.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK, VOCAB, SAMPLE_MB = 256, 8192, 32


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


S3_ENV = "RAYDP_LLM_BENCH_S3"  # the S3 stand-in's endpoint, for the measuring children


def measure_etl(path: Path, executors: int, out: Path, protected: bool = True,
                on_s3: bool = False, inputs: list[str] | None = None) -> dict:
    from dataclasses import replace

    from hydra import compose, initialize_config_dir

    from raydp_llm.cli.inputs import check_inputs, typed_settings
    from raydp_llm.core.registry import register_configs
    from raydp_llm.data import cache
    from raydp_llm.data.etl.records import EtlPlan
    from raydp_llm.data.etl.run import run_etl
    from raydp_llm.engines.ray_cluster import ray_session
    from raydp_llm.engines.spark import spark_session

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                *(inputs or [f"data.path={path}"]),
                "tokenizer=bpe",
                f"tokenizer.vocab_size={VOCAB}",
                f"tokenizer.sample_mb={SAMPLE_MB}",
                f"model.block_size={BLOCK}",
                f"cluster.executors={executors}",
                "cluster.executor_cores=1",  # etl-1 and etl-2: 1 and 2 cores
                "cluster.executor_memory=3g",
                "data.decontaminate=off",  # the ETL's own phases (the check: contamination.py)
                *([f"s3.endpoint_url={os.environ[S3_ENV]}"] if on_s3 else []),
            ],
        )
    cfg = typed_settings(cfg)
    if not protected:
        cfg = replace(cfg, cluster=replace(cfg.cluster, spark_conf={
            "spark.authenticate": "false", "spark.network.crypto.enabled": "false"}))
    corpus = check_inputs(cfg)
    with ray_session(cfg.cluster, cfg.name):
        t = time.perf_counter()
        with spark_session(cfg.cluster, app_name="bench", log_dir=out) as spark:
            start_s = time.perf_counter() - t
            t = time.perf_counter()
            plan = EtlPlan.of(cfg, corpus)
            result = run_etl(spark, plan)
            t_write = time.perf_counter()
            entry = write_entry(result, out, plan.s3, on_s3)
            result.phase_s["write"] = time.perf_counter() - t_write
            etl_s = time.perf_counter() - t
    t = time.perf_counter()
    sources = cache.parquet_sources(entry, result.index, plan.s3)
    for split, index in result.index.items():
        for c, start in enumerate(index.start):
            sources[split].fetch(c, start)
    return {
        "read_s": time.perf_counter() - t,
        "start_s": start_s,
        "etl_s": etl_s,
        "tokens": result.manifest.tokens,
        "chunks": result.manifest.chunks_train + result.manifest.chunks_val,
        "rss_mb": peak_rss_mb(),
        "phase_s": {k: round(v, 1) for k, v in result.phase_s.items()},
    }


def write_entry(result, out: Path, s3, on_s3: bool):
    """The ETL's chunks written and committed as a cache entry: in ``out/cache``, or on the S3
    stand-in (a bucket of its own per run)."""
    from raydp_llm.data import cache
    from raydp_llm.data.etl.handoff import to_parquet, to_s3

    if not on_s3:
        return cache.commit(to_parquet(result, out / "cache", "bench"), stats={})
    return to_s3(result, f"s3://bench/{out.name}", "bench", s3).commit(stats={})


def measure_single(path: Path, out: Path) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raydp_llm.core.tokenizer import train_bpe

    t = time.perf_counter()
    lines = [line + "\n" for line in path.read_text().split("\n")]
    sample, size = [], 0
    for line in lines:  # the first SAMPLE_MB of text
        if size >= SAMPLE_MB * 1e6:
            break
        sample.append(line)
        size += len(line)
    tok = train_bpe((sample[i:i + 10_000] for i in range(0, len(sample), 10_000)), VOCAB)
    ids = np.concatenate([[tok.eod_id]] + [e.ids for e in tok.tok.encode_batch(lines)]).astype(
        np.uint16
    )
    boundary = len(ids) - int(round(len(ids) * 0.1))
    for name, part in (("train", ids[:boundary]), ("val", ids[boundary:])):
        starts = np.arange(0, len(part) - BLOCK, BLOCK)
        win = np.lib.stride_tricks.sliding_window_view(part, BLOCK + 1)[starts]
        table = pa.table({"start": starts, "tokens": [w.tobytes() for w in win]})
        pq.write_table(table, out / f"{name}.parquet")
    return {
        "start_s": 0.0,
        "etl_s": time.perf_counter() - t,
        "tokens": len(ids),
        "rss_mb": peak_rss_mb(),
    }


def run_one(kind: str, path: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, __file__, "--measure", kind, "--path", str(path), "--out", tmp],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    if proc.returncode:
        raise RuntimeError(f"{kind} on {path} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[25, 50, 100], help="corpus sizes, MB"
    )
    parser.add_argument(
        "--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    )
    parser.add_argument("--security", action="store_true",
                        help="etl-2 with Spark's authentication and encryption on, against off")
    parser.add_argument("--s3", action="store_true",
                        help="etl-2 with the ETL cache on an S3 stand-in, against local")
    parser.add_argument("--table", action="store_true",
                        help="etl-2 on a Delta table's snapshot, against its Parquet files")
    parser.add_argument("--repeats", type=int, default=2,
                        help="--security, --s3, --table: runs of each")
    parser.add_argument("--measure", choices=["etl-1", "etl-2", "etl-2-open", "etl-2-s3",
                                              "etl-2-table", "etl-2-parquet", "single"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def measure(kind: str, path: Path, out: Path) -> dict:
    """One measurement in this (fresh) process: ``single``, or ``etl-N`` with N executors
    (``etl-2-open``: without Spark's authentication and encryption)."""
    if kind == "single":
        return measure_single(path, out)
    if kind in ("etl-2-table", "etl-2-parquet"):  # ``path``: the Delta table's directory
        from deltalake import DeltaTable

        files = ",".join(sorted(DeltaTable(path).file_uris()))
        given = f"data.table={path}" if kind == "etl-2-table" else f"data.path=[{files}]"
        return measure_etl(path, 2, out, inputs=[given, "data.format=parquet"])
    return measure_etl(path, int(kind[4]), out, protected=not kind.endswith("-open"),
                       on_s3=kind.endswith("-s3"))


def delta_table(text: Path, directory: Path) -> Path:
    """The paragraphs of ``text`` as a Delta table's rows (column ``text``), in four appends."""
    import pyarrow as pa
    from deltalake import write_deltalake

    paragraphs = [p for p in text.read_text().split("\n\n") if p.strip()]
    quarter = -(-len(paragraphs) // 4)
    for i in range(0, len(paragraphs), quarter):
        write_deltalake(directory, pa.table({"text": paragraphs[i:i + quarter]}), mode="append")
    return directory


def measure_all(corpus: Path, sizes: list[int], kinds=("single", "etl-1", "etl-2"),
                table: bool = False) -> list[dict]:
    """Every pipeline (``kinds``) on the corpus repeated to each size (with ``table``, as a
    Delta table's rows), each in a fresh process; one row each."""
    text = corpus.read_text()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in sizes:
            path = Path(tmp) / f"corpus_{mb}mb.txt"
            path.write_text(text * max(1, round(mb * 1e6 / len(text.encode()))))
            size_mb = path.stat().st_size / 1e6
            if table:
                path = delta_table(path, Path(tmp) / f"table_{mb}mb")
            for kind in kinds:
                r = run_one(kind, path)
                rows.append({"mb": size_mb, "kind": kind, **r})
                print(f"  measured {kind:6} on {size_mb:6.1f} MB: {r['etl_s']:6.1f}s "
                      f"(+{r['start_s']:.1f}s start-up), peak RSS {r['rss_mb']:.0f} MB "
                      f"{r.get('phase_s', '')}", file=sys.stderr, flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    """The rows as a Markdown table, each against the single-process baseline of its size."""
    header = [
        "corpus MB",
        "pipeline",
        "start-up s",
        "ETL s",
        "MB/s",
        "tokens/s",
        "vs single",
        "1→2 executors",
        "driver RSS MB",
    ]
    print("\n| " + " | ".join(header) + " |\n|" + "---:|" * len(header))
    for r in rows:
        single = next(x for x in rows if x["mb"] == r["mb"] and x["kind"] == "single")
        one = next(x for x in rows if x["mb"] == r["mb"] and x["kind"] == "etl-1")
        speedup = f"{one['etl_s'] / r['etl_s']:.2f}×" if r["kind"] == "etl-2" else ""
        cells = [
            f"{r['mb']:.0f}",
            r["kind"],
            f"{r['start_s']:.1f}",
            f"{r['etl_s']:.1f}",
            f"{r['mb'] / r['etl_s']:.2f}",
            f"{r['tokens'] / r['etl_s']:,.0f}",
            f"{single['etl_s'] / r['etl_s']:.2f}×",
            speedup,
            f"{r['rss_mb']:.0f}",
        ]
        print("| " + " | ".join(cells) + " |")


def print_security_table(rows: list[dict]) -> None:
    """Each run of etl-2 with protection on and off, against the mean of those off."""
    print("\n| corpus MB | Spark | start-up s | ETL s | vs off |\n|---:|---:|---:|---:|---:|")
    for mb in sorted({r["mb"] for r in rows}):
        runs = [r for r in rows if r["mb"] == mb]
        off = [r["etl_s"] for r in runs if r["kind"] == "etl-2-open"]
        base = sum(off) / len(off)
        for r in sorted(runs, key=lambda r: r["kind"]):
            kind = "open" if r["kind"] == "etl-2-open" else "secret + encryption"
            print(f"| {mb:.0f} | {kind} | {r['start_s']:.1f} | {r['etl_s']:.1f} | "
                  f"{r['etl_s'] / base:.3f}× |")


def print_s3_table(rows: list[dict]) -> None:
    """Each run of etl-2 with the cache on S3 and local: the write and the read, against the mean
    of the local runs."""
    print("\n| corpus MB | cache | ETL s | write s | write vs local | read s | read vs local |\n"
          "|---:|---:|---:|---:|---:|---:|---:|")
    for mb in sorted({r["mb"] for r in rows}):
        runs = [r for r in rows if r["mb"] == mb]
        local = [r for r in runs if r["kind"] == "etl-2"]
        write = sum(r["phase_s"]["write"] for r in local) / len(local)
        read = sum(r["read_s"] for r in local) / len(local)
        for r in sorted(runs, key=lambda r: r["kind"]):
            where = "S3 stand-in" if r["kind"] == "etl-2-s3" else "local"
            print(f"| {mb:.0f} | {where} | {r['etl_s']:.1f} | {r['phase_s']['write']:.1f} | "
                  f"{r['phase_s']['write'] / write:.2f}× | {r['read_s']:.2f} | "
                  f"{r['read_s'] / read:.2f}× |")


def print_table_table(rows: list[dict]) -> None:
    """Each run of etl-2 on the table and on its files: tokens/s against the files' mean."""
    print("\n| corpus MB | input | start-up s | ETL s | tokens | tokens/s | vs the files |\n"
          "|---:|---|---:|---:|---:|---:|---:|")
    for mb in sorted({r["mb"] for r in rows}):
        runs = [r for r in rows if r["mb"] == mb]
        files = [r["tokens"] / r["etl_s"] for r in runs if r["kind"] == "etl-2-parquet"]
        base = sum(files) / len(files)
        for r in sorted(runs, key=lambda r: r["kind"]):
            given = "data.table" if r["kind"] == "etl-2-table" else "data.path (the same files)"
            rate = r["tokens"] / r["etl_s"]
            print(f"| {mb:.0f} | {given} | {r['start_s']:.1f} | {r['etl_s']:.1f} | "
                  f"{r['tokens']:,} | {rate:,.0f} | {rate / base:.3f}× |")


@contextlib.contextmanager
def s3_stand_in():
    """A moto server on 127.0.0.1 with the bucket ``bench``, its endpoint in ``S3_ENV`` and fake
    credentials in the environment the measuring children (and their Spark) inherit."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    for key, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"
                       }.items():
        os.environ.setdefault(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    os.environ[S3_ENV] = f"http://{host}:{port}"
    pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http",
                      allow_bucket_creation=True).create_dir("bench")
    try:
        yield
    finally:
        server.stop()


def main() -> None:
    args = parse_args()
    if args.measure:  # a child of run_one: print one result as JSON
        print(json.dumps(measure(args.measure, args.path, args.out)))
        return
    if args.s3:
        with s3_stand_in():
            print_s3_table(measure_all(args.corpus, args.sizes, ("etl-2", "etl-2-s3")
                                       * args.repeats))
        return
    if args.table:
        kinds = ("etl-2-parquet", "etl-2-table") * args.repeats
        print_table_table(measure_all(args.corpus, args.sizes, kinds, table=True))
        return
    if args.security:
        kinds = ("etl-2", "etl-2-open") * args.repeats
        print_security_table(measure_all(args.corpus, args.sizes, kinds))
        return
    print_table(measure_all(args.corpus, args.sizes))


if __name__ == "__main__":
    main()
