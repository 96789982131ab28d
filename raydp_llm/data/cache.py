"""The ETL cache: the token stream's chunks (Parquet, a row group per chunk), their index,
tokenizer, manifest and Spark's stats under ``data.cache_dir/<key>/``; the ETL writes an entry
(``etl/handoff.to_parquet``), this module keys, locks, seals, checks and reads it.

The key hashes the inputs' fingerprints (paths, sizes, modification times) and every setting the ETL
reads; not the window settings (``model.block_size``, ``data.stride``, ``data.sampling``): windows
are cut when read, so one entry serves them all.

An entry is complete or rebuilt, never trained on in part:
- it is written under a temporary name (``.<key>.tmp-<pid>-<random>``), everything in it (the Spark
  stats too), sealed (``complete.json``: every file and its size), then renamed into place;
- a hit checks the entry against its seal and its manifest (each split's Parquet row count is the
  window count the manifest promises); a damaged or partial entry is rebuilt, with one line;
- one run at a time builds or checks a key (a lock file, ``.<key>.lock``): a second run with the
  same key waits and then uses the first one's entry; temporary entries that no live process is
  writing are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import psutil
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raydp_llm.core import integrity, storage
from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import first_line
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import WEIGHT_SUFFIXES, Tokenizer, load_tokenizer
from raydp_llm.data import stream
from raydp_llm.data.etl.records import Manifest
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.stream import ChunkIndex, ParquetChunks
from raydp_llm.data.windows import SPLITS

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATS_FILE = "etl_stats.json"
DOCUMENTS = "documents"  # Parquet: path, doc, start, end, tokens, val
REMOVED = "removed"  # Parquet: path, doc, bytes, reason, kept_src, kept_doc
REMOVED_SAMPLE = "removed_sample.json"
ETL_VERSION = 5  # bump when the ETL's output changes for the same inputs and settings
TMP_NAME = re.compile(r"^\.(?P<key>[^.]+)\.tmp-(?P<pid>\d+)-[0-9a-f]+$")
# Windows are cut when read: these settings are not the ETL's (nor is model.block_size)
READ_SETTINGS = ("stride", "val_stride", "sampling")


def cache_key(corpus: Corpus, data: DataSettings, tokenizer_settings, seed: int,
              chat: dict | None = None) -> str:
    """The ETL's inputs (their fingerprints) and every setting it reads, hashed; ``chat``: what a
    chat ETL reads beyond ``data`` (``prepare.chat_key``: the block size, the template)."""
    settings = asdict(data)
    # the inputs are in the fingerprints; the window settings are read, not written
    for irrelevant in ("cache", "cache_dir", "path", "max_files", "table", "table_version",
                       "table_as_of", "table_since", "catalog", *READ_SETTINGS):
        settings.pop(irrelevant, None)
    scores = data.filters.score_path
    if scores and "://" not in scores:  # the scores are an input: their content is in the key
        settings["score_file_sha256"] = _file_hash(Path(scores))
    tokenizer = asdict(tokenizer_settings)
    if tokenizer_settings.path:
        tokenizer["file_sha256"] = _file_hash(Path(tokenizer_settings.path))
    blob = json.dumps(
        {
            "version": ETL_VERSION,
            "inputs": corpus.fingerprints,
            "markdown": corpus.markdown,
            "data": settings,
            "tokenizer": tokenizer,
            "seed": seed,
        } | ({} if chat is None else {"chat": chat}),
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _file_hash(path: Path) -> str:
    """SHA-256 of a file, or of a directory's files in name order (a Parquet dataset)."""
    digest = hashlib.sha256()
    for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):  # a model=hf tokenizer's dir
            digest.update(f.read_bytes())
    return digest.hexdigest()


def location(cache_dir: str) -> Path | str:
    """``data.cache_dir`` as the cache's functions take it: a local directory, or an S3 URI
    (``s3_cache``)."""
    return storage.s3_uri(cache_dir) if storage.is_s3(cache_dir) else Path(cache_dir)


@contextlib.contextmanager
def locked(cache_dir: Path | str, key: str) -> Iterator[None]:
    """Hold ``key``'s lock: one run at a time checks, builds or replaces its entry. Leftover
    temporary entries (their writer is gone) are removed once it is held. A cache on S3 has no
    lock (``s3_cache``: two runs may build a key at once; one copy is sealed)."""
    if storage.is_s3(str(cache_dir)):  # S3 has no lock: s3_cache seals by a conditional write
        yield
        return
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / f".{key}.lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            log.info("another run (pid %s) is building ETL cache entry %s; waiting for "
                     "it", lock.read().strip()
                     or "?", cache_dir / key)
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        remove_leftovers(cache_dir)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def remove_leftovers(cache_dir: Path) -> None:
    """Delete the temporary entries whose writing process is gone (killed mid-write)."""
    for path in Path(cache_dir).iterdir():
        match = TMP_NAME.match(path.name)
        if match and not psutil.pid_exists(int(match["pid"])):
            shutil.rmtree(path, ignore_errors=True)


def entry_problem(entry: Path | str, s3: S3Options = S3Options()) -> str | None:
    """None when ``entry`` (local, or on S3: ``s3_cache``) is complete: sealed, its files as the
    seal lists them, and each split's Parquet files holding the manifest's chunks; else what is
    wrong."""
    damage = integrity.problem(entry, s3, hashes=False)
    if damage:
        return damage
    manifest = Manifest.from_json(storage.read_json(f"{entry}/{MANIFEST}", s3))
    fs, root = storage.resolve(entry, s3)
    for split in SPLITS:
        files = fs.get_file_info(pafs.FileSelector(f"{root}/{split}", allow_not_found=True))
        try:
            rows = sum(pq.ParquetFile(f.path, filesystem=fs).metadata.num_rows
                       for f in sorted(files, key=lambda f: f.path)
                       if f.path.endswith(".parquet"))
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            return f"{split}/ has an unreadable Parquet file ({first_line(err, 100)})"
        if rows != manifest.chunks(split):
            return f"{split}/ holds {rows} chunks, the manifest {manifest.chunks(split)}"
    return None


def lookup(cache_dir: Path, key: str, check: Callable[[Path], str | None] = entry_problem
           ) -> Path | None:
    """The complete entry for ``key``, or None. A damaged entry is removed (one line), to be built
    again. Hold ``locked(cache_dir, key)``. ``check``: what is wrong with an entry of its kind
    (None: nothing)."""
    entry = Path(cache_dir) / key
    if not entry.exists():
        return None
    damage = check(entry)
    if damage is None:
        return entry
    log.warning("ETL cache entry %s is damaged (%s): rebuilding it", entry, damage)
    _remove(entry)
    return None


def temporary_entry(cache_dir: Path, key: str) -> Path:
    """A new temporary name for ``key``'s entry (``TMP_NAME``: this process's, so that
    ``remove_leftovers`` knows when its writer is gone)."""
    return Path(cache_dir) / f".{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def commit(tmp: Path, stats: dict, check: Callable[[Path], str | None] = entry_problem) -> Path:
    """Add Spark's stats to a staged entry, seal it and rename it into place
    (``<cache_dir>/<key>``). Should a complete entry be there already (another run, not holding this
    key's lock, won), that one is kept. ``check``: as ``lookup``'s."""
    key = TMP_NAME.match(tmp.name)["key"]
    final = tmp.parent / key
    try:
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2))
        integrity.seal(tmp, hashes=False)
        if final.exists() and check(final) is not None:
            _remove(final)
        try:
            tmp.rename(final)
        # the rename lost to a complete entry (a non-empty directory is never replaced)
        except OSError:
            if check(final) is not None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _remove(entry: Path) -> None:
    """Rename first, then delete: a kill midway leaves a leftover, never a half-deleted entry under
    its key."""
    doomed = temporary_entry(entry.parent, entry.name)
    entry.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def read_entry(entry: Path) -> tuple[dict[str, ChunkIndex], Tokenizer, Manifest, dict]:
    """The chunk index, the tokenizer, the manifest and Spark's stats of an entry."""
    stats = json.loads((entry / STATS_FILE).read_text()) if (entry / STATS_FILE).is_file() else {}
    manifest = Manifest.from_json(json.loads((entry / MANIFEST).read_text()))
    return stream.read_index(entry), load_tokenizer(entry), manifest, stats


def parquet_sources(entry: Path | str, index: dict[str, ChunkIndex],
                    s3: S3Options = S3Options()) -> dict[str, ParquetChunks]:
    """Where the workers read each split's chunks: the entry's Parquet files (local, or on S3),
    row group by row group."""
    return {name: ParquetChunks(f"{entry}/{name}", index[name], s3) for name in SPLITS}
