"""The ETL cache on S3 (``data.cache_dir=s3://bucket/prefix``): the entries of the local cache
(``cache.py``: the same key, files, seal and checks), which every node of a cluster reads and
every later run on the same data and settings finds.

S3 has no rename and no lock, so an entry is never written in place:
- a run that builds a key writes an attempt of its own, ``<cache_dir>/<key>/<attempt>/``: the
  executors write the chunks' Parquet files (``etl/handoff.to_s3``), the driver the small files
  (index, tokenizer, manifest, Spark's stats), and the seal (``complete.json``) last;
- the key's pointer, ``<cache_dir>/<key>/sealed.json``, names the attempt every run reads. It is
  written once, by a conditional PUT (``storage.write_new``): of two runs that built a key at
  once, the later finds the earlier's pointer, deletes its own attempt and trains on the other's;
- a reader trusts nothing but an attempt the pointer names and whose seal holds; a damaged
  entry's pointer is deleted (one line), and the run builds the key again.
An attempt whose writer died before its pointer stays behind, named by nothing and never read (a
lifecycle rule on the prefix clears such leftovers: docs/deploy-emr.md).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from raydp_llm.core import integrity, storage
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data import cache
from raydp_llm.data.etl.records import Manifest
from raydp_llm.data.stream import ChunkIndex

log = logging.getLogger(__name__)

POINTER = "sealed.json"  # {"attempt": <name>}: the key's one sealed copy


@dataclass(frozen=True)
class Staged:
    """An attempt being written: ``uri`` on S3 (the executors' Parquet files), ``local`` (the
    driver's small files, uploaded at the commit)."""

    cache_dir: str
    key: str
    name: str
    local: Path
    s3: S3Options

    @property
    def uri(self) -> str:
        return storage.join(self.cache_dir, self.key, self.name)

    def commit(self, stats: dict) -> str:
        """Add Spark's stats, upload the small files, seal the attempt (its seal lists the
        executors' files too) and name it in the key's pointer, unless another run's attempt is
        named already: the entry every run of the key reads, returned."""
        try:
            (self.local / cache.STATS_FILE).write_text(json.dumps(stats, indent=2))
            fs, root = storage.resolve(self.uri, self.s3)
            files = {info.path.removeprefix(f"{root}/"): {"bytes": info.size}
                     for info in storage.walk(fs, root)}  # the executors' files
            integrity.write_marker(self.local, files | integrity.listing(self.local, False))
            storage.write_tree(self.local, fs, root)  # the seal last
        except BaseException:
            self.discard()
            raise
        shutil.rmtree(self.local, ignore_errors=True)
        return self._named()

    def _named(self) -> str:
        """This attempt, named in the key's pointer; or, when another run named its own first,
        that one (this one deleted)."""
        pointer = storage.join(self.cache_dir, self.key, POINTER)
        for _ in range(2):  # a damaged entry's pointer is deleted: this attempt may take its place
            if storage.write_new(pointer, json.dumps({"attempt": self.name}), self.s3):
                return self.uri
            found = lookup(self.cache_dir, self.key, self.s3)
            if found is not None:
                log.info("another run sealed ETL cache entry %s first: using its copy", found)
                self.discard()
                return found
        raise RuntimeError(f"{pointer}: could not name the ETL cache entry's copy (another run "
                           "keeps replacing it); run again")

    def discard(self) -> None:
        """Delete what this attempt wrote, on S3 and here."""
        shutil.rmtree(self.local, ignore_errors=True)
        storage.remove(self.uri, self.s3)


def new_attempt(cache_dir: str, key: str, s3: S3Options) -> Staged:
    """A new attempt at ``key``'s entry: a name of its own (the time, then random), and a local
    directory for the driver's files."""
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    local = Path(tempfile.mkdtemp(prefix=f"raydp_llm-etl-{key}-"))
    return Staged(cache_dir, key, name, local, s3)


def lookup(cache_dir: str, key: str, s3: S3Options) -> str | None:
    """The sealed entry of ``key`` (its attempt's URI), or None. A damaged one's pointer is
    deleted (one line), for this run to build the key again."""
    pointer = storage.join(cache_dir, key, POINTER)
    try:
        entry = storage.join(cache_dir, key, storage.read_json(pointer, s3)["attempt"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as err:
        damage = f"its {POINTER} is unreadable ({type(err).__name__})"
    else:
        damage = cache.entry_problem(entry, s3)
        if damage is None:
            return entry
    log.warning("ETL cache entry %s is damaged (%s): rebuilding it", pointer, damage)
    storage.remove(pointer, s3)
    return None


def read_entry(entry: str, s3: S3Options) -> tuple[dict[str, ChunkIndex], Tokenizer, Manifest,
                                                   dict]:
    """``cache.read_entry`` of an S3 entry: its small files (the top level: index, tokenizer,
    manifest, stats) copied here for the time of reading; the chunks stay on S3."""
    fs, root = storage.resolve(entry, s3)
    with tempfile.TemporaryDirectory(prefix="raydp_llm-etl-") as local:
        for info in fs.get_file_info(pafs.FileSelector(root)):
            if info.type == pafs.FileType.File:
                name = info.path.rsplit("/", 1)[-1]
                Path(local, name).write_bytes(storage.retried(
                    lambda path=info.path: _read(fs, path), s3))
        return cache.read_entry(Path(local))


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()
