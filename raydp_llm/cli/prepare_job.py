"""The ETL job behind ``python -m raydp_llm.prepare``, once ``cli/prepare.py`` has checked its
input: Ray, Spark's ETL (or its cache), the manifest, the removed documents, a few lines."""

from __future__ import annotations

import contextlib
import shutil
import textwrap
from pathlib import Path

from raydp_llm.core import storage
from raydp_llm.core.config import Settings
from raydp_llm.core.storage import S3Options
from raydp_llm.core.timing import Stopwatch
from raydp_llm.data import cache
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.prepare import PreparedData, curation_lines, dataset_store, write_json
from raydp_llm.training.driver.mixed_data import each_source
from raydp_llm.training.driver.session import job_session

REMOVED_SAMPLE_TEXT = "removed_sample.txt"


def run_checked(settings: Settings, corpus: Corpus | dict[str, Corpus], out_dir: Path,
                total: Stopwatch) -> None:
    """The ETL on checked ``settings`` into the ETL cache (or ``out_dir``), what it made printed;
    a mixture's (``corpus``: one per source) source by source."""
    if settings.data.sources:
        run_sources(settings, corpus, out_dir, total)
        return
    with job_session(settings, dataset_store(settings.data, out_dir)) as session:
        with session.prepared(corpus, out_dir) as data:
            manifest = data.manifest_json() | {"cache_hit": data.cache_hit,
                                               "dataset": str(data.entry)}
            write_json(out_dir / "manifest.json", manifest)
    removed = removed_documents(data.entry, out_dir, S3Options.of(settings.s3))
    print(describe(data, manifest))
    if removed:
        print(f"  removed documents: {removed}/ (Parquet: path, doc, bytes, reason, the kept "
              f"copy); a sample: {out_dir / REMOVED_SAMPLE_TEXT}")
    print(f"  done in {total.seconds():.0f}s; manifest.json and etl_stats.json in "
          f"{out_dir}")


def run_sources(settings: Settings, corpora: dict[str, Corpus], out_dir: Path,
                total: Stopwatch) -> None:
    """A mixture (``data.sources``): each source's ETL into its own cache entry, the one a
    training run of the mixture reads, its manifest in ``out_dir/sources/<name>/``; the
    manifests by source in ``out_dir/manifest.json``."""
    manifests = {}
    with job_session(settings, dataset_store(settings.data, out_dir)) as session, \
            contextlib.ExitStack() as held:
        for source, data in each_source(session, settings, corpora, out_dir, held, to_ray=False):
            manifests[source.name] = data.manifest_json() | {"cache_hit": data.cache_hit,
                                                             "dataset": str(data.entry),
                                                             "weight": source.weight}
            write_json(out_dir / "sources" / source.name / "manifest.json",
                       manifests[source.name])
            print(f"source {source.name} (weight {source.weight}): "
                  f"{describe(data, manifests[source.name])}")
    write_json(out_dir / "manifest.json", {"sources": manifests})
    print(f"  done in {total.seconds():.0f}s; manifest.json in {out_dir}, each source's in "
          f"{out_dir / 'sources'}/<name>/")


def removed_documents(entry: Path | str | None, out_dir: Path, s3: S3Options) -> Path | None:
    """The documents curation removed, into the run directory for a person to inspect: their ids
    (``removed/``, Parquet) and a few of each reason with their text (``removed_sample.txt``).
    ``entry``: the ETL's output, local or on S3."""
    if entry is None or not storage.exists(f"{entry}/{cache.REMOVED_SAMPLE}", s3):
        return None
    target = out_dir / cache.REMOVED
    if isinstance(entry, str):  # on S3
        storage.fetch(f"{entry}/{cache.REMOVED}", target, s3)
    elif target.resolve() != (entry / cache.REMOVED).resolve():  # cache=false: already there
        shutil.copytree(entry / cache.REMOVED, target, dirs_exist_ok=True)
    sample = storage.read_json(f"{entry}/{cache.REMOVED_SAMPLE}", s3)
    with open(out_dir / REMOVED_SAMPLE_TEXT, "w") as f:
        for d in sample:
            copy = f" (a copy of {d['kept_src']} doc {d['kept_doc']})" if d["kept_src"] else ""
            f.write(f"[{d['reason']}] {d['src']} doc {d['doc']}{copy}\n"
                    + textwrap.indent(d["text"], "    ") + "\n\n")
    return target


def describe(data: PreparedData, m: dict) -> str:
    """What the ETL made, and what Spark did, in a few lines."""
    st = data.stats
    per_token = f", {m['chars_per_token']:.2f} chars/token" if m["chars_per_token"] else ""
    phases = ", ".join(f"{k} {v:.1f}" for k, v in st.get("phase_s", {}).items())
    hit = " (cache hit: Spark not started)" if data.cache_hit else ""
    return (f"{m['corpus']}: {m['files']} files, {m['documents']} documents, {m['characters']:,} "
            f"characters\n  tokenizer {m['tokenizer']} (vocab {m['vocab_size']}{per_token}), "
            f"{m['tokens']:,} tokens: train {m['tokens_train']:,} / val {m['tokens_val']:,}\n  "
            f"{m['chunks_train']:,} / {m['chunks_val']:,} chunks, "
            f"{m['token_bytes_stored'] / max(m['tokens'], 1):.2f} bytes per token; windows of "
            f"{m['block_size'] + 1} tokens ({m['sampling']}, stride {m['stride']}): train "
            f"{m['windows_train']:,} / val {m['windows_val']:,}\n  Spark: {st.get('jobs', 0)} "
            f"jobs, {st.get('stages', 0)} stages, {st.get('tasks', 0)} tasks "
            f"({st.get('failed_tasks', 0)} failed), {st.get('input_bytes', 0):,} bytes read, "
            f"{st.get('shuffle_write_bytes', 0):,} bytes shuffled; phases (s): {phases}\n  "
            f"dataset: {data.entry}{hit}{_bad_json(m)}"
            + "".join(f"\n  {line}" for line in curation_lines(m)))


def _bad_json(m: dict) -> str:
    """JSONL: the bad lines skipped, by kind, when there were any."""
    bad = m.get("bad_json_lines")
    if not bad or not bad["files"]:
        return ""
    kinds = ", ".join(f"{kind.replace('_', ' ')} {n:,}" for kind, n in bad.items()
                      if kind != "files")
    return f"\n  bad JSON lines skipped: {kinds}, in {len(bad['files'])} files (manifest.json)"
