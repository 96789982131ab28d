"""What a corpus format costs the ETL: the same documents as plain text (the baseline), as JSON
Lines, and as JSON Lines compressed with gzip, bzip2 and zstd, each through this Spark ETL.

    python benchmarks/formats.py [--mb 50] [--files 4] [--kinds text,jsonl,jsonl.gz,...]

The documents are the benchmark corpus's paragraphs (split at blank lines), repeated to about
``--mb`` MB of text in ``--files`` files: ``text`` holds them separated by blank lines
(``data.document_split=blank_line``), ``jsonl`` one ``{"id": ..., "text": ...}`` object per line.
Each kind runs ``python -m raydp_llm.prepare`` (char tokenizer, 2 executors, no cache) in a fresh
process; the table shows the ETL's seconds after Spark's start (read and scan, tokenizer, encode,
write), MB of text per second, the ratio to plain text, and the input's size on disk. The JSON Lines
kinds must make the same dataset (documents, tokens and vocabulary; plain text differs: each of its
paragraphs keeps its newline).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
CODECS = {"jsonl.gz": "gzip", "jsonl.bz2": "bz2", "jsonl.zst": "zstd"}
KINDS = ["text", "jsonl", *CODECS]


def documents(corpus: Path, mb: float) -> list[str]:
    paragraphs = [p for p in corpus.read_text().split("\n\n") if p.strip()]
    size = sum(len(p) + 2 for p in paragraphs)
    return paragraphs * max(1, round(mb * 1e6 / size))


def write_corpus(kind: str, docs: list[str], files: int, where: Path) -> Path:
    """The documents as ``kind`` in ``files`` files under ``where/kind``."""
    folder = where / kind
    folder.mkdir()
    per_file = -(-len(docs) // files)
    for f in range(files):
        part = docs[f * per_file:(f + 1) * per_file]
        if kind == "text":
            (folder / f"part{f}.txt").write_text("".join(d + "\n\n" for d in part))
            continue
        data = "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(part))
        path = folder / f"part{f}.{kind}"
        if kind == "jsonl":
            path.write_text(data)
            continue
        with pa.CompressedOutputStream(str(path), CODECS[kind]) as out:
            out.write(data.encode())
    return folder


def run_prepare(kind: str, folder: Path, out: Path) -> dict:
    fmt = ["data.format=text", "data.document_split=blank_line"]
    if kind != "text":
        fmt = ["data.format=jsonl"]
    proc = subprocess.run(
        [sys.executable, "-m", "raydp_llm.prepare", f"data.path={folder}", *fmt, "data.cache=false",
         "data.max_files=null", "tokenizer=char", f"hydra.run.dir={out}",
         "data.decontaminate=off", "cluster.executors=2", "cluster.executor_cores=1"],
        capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{kind} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    stats = json.loads((out / "etl_stats.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    return {"etl_s": sum(stats["phase_s"].values()), "characters": manifest["characters"],
            "dataset": [manifest[k] for k in ("documents", "tokens", "tokenizer_hash")]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50, help="MB of text")
    parser.add_argument("--files", type=int, default=4, help="files per corpus")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of " +
                        ", ".join(KINDS))
    parser.add_argument(
        "--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    args = parser.parse_args()
    docs = documents(args.corpus, args.mb)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            folder = write_corpus(kind, docs, args.files, Path(tmp))
            on_disk = sum(f.stat().st_size for f in folder.iterdir())
            results[kind] = run_prepare(kind, folder, Path(tmp) / f"run-{kind}") | {
                "on_disk": on_disk}
            print(f"  {kind}: {results[kind]['etl_s']:.1f} s", file=sys.stderr, flush=True)
    base = results.get("text") or next(iter(results.values()))
    jsonl = results.get("jsonl")
    text_mb = base["characters"] / 1e6
    print(f"\n{len(docs):,} documents, {text_mb:.0f} MB of text in {args.files} files, char "
          "tokenizer, 2 executors\n")
    print("| format | on disk (MB) | ETL s | MB/s of text | speed vs text | dataset = jsonl's |")
    print("|---|---:|---:|---:|---:|---|")
    for kind, r in results.items():
        same = "-"
        if kind.startswith("jsonl") and jsonl:
            same = "yes" if r["dataset"] == jsonl["dataset"] else "NO"
        speed = text_mb / r["etl_s"]
        print(f"| {kind} | {r['on_disk'] / 1e6:.1f} | {r['etl_s']:.1f} | {speed:.1f} "
              f"| {base['etl_s'] / r['etl_s']:.2f}× | {same} |")


if __name__ == "__main__":
    main()
