"""The prompts' ETL in the ETL cache (``data.format=prompts``): an entry under
``data.cache_dir/<key>/`` holds each split's numbered prompts (``train.parquet``, ``val.parquet``,
``dataset.TABLE_SCHEMA``) and the prompts' manifest; a second run on the same inputs and
settings reads them into Ray's object store without starting Spark.

The key is the token stream's (``cache.cache_key``: the inputs' fingerprints, every data setting,
the tokenizer's file, the seed) and what the prompts' ETL reads beyond them: the format, the
template's text and the most tokens a prompt keeps. Entries are written, sealed, checked and
locked as the token stream's are (``cache``); a damaged one is rebuilt, with one line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq

from raydp_llm.core import storage
from raydp_llm.core.config import Settings
from raydp_llm.core.errors import first_line
from raydp_llm.core.integrity import problem
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data import cache
from raydp_llm.data.chat.template import ChatTemplate
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.prompts.dataset import (
    SPLITS,
    PromptData,
    PromptManifest,
    PromptSource,
    log_counts,
    prompt_limit,
    prompt_tools,
)

log = logging.getLogger(__name__)

PROMPT_MANIFEST = "prompt_manifest.json"  # PromptManifest's fields, as written


def prompt_key(settings: Settings, corpus: Corpus, template: ChatTemplate | None,
               limit: int) -> str:
    """The entry's key: what the prompts' ETL reads, hashed."""
    extra = {"format": "prompts", "prompt_tokens_limit": limit,
             "template": template and template.text,
             "template_specials": template and template.specials}
    return cache.cache_key(corpus, settings.data, settings.tokenizer, settings.seed, extra)


def entry_problem(entry: Path) -> str | None:
    """None when ``entry`` is sealed whole and each split's Parquet file holds the manifest's
    count; else what is wrong."""
    damage = problem(entry, hashes=False)
    if damage:
        return damage
    manifest = PromptManifest(**json.loads((entry / PROMPT_MANIFEST).read_text()))
    for split in SPLITS:
        try:
            rows = pq.ParquetFile(entry / f"{split}.parquet").metadata.num_rows
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            return f"{split}.parquet is unreadable ({first_line(err, 100)})"
        if rows != manifest.splits[split]:
            return f"{split}.parquet holds {rows} prompts, the manifest {manifest.splits[split]}"
    return None


def read(entry: Path, tokenizer: Tokenizer, template: ChatTemplate | None) -> PromptData:
    """The entry's prompts in Ray's object store, with its manifest."""
    import ray

    log.info("ETL cache hit: %s (Spark not started)", entry)
    manifest = PromptManifest(**json.loads((entry / PROMPT_MANIFEST).read_text()))
    sources = {}
    for split in SPLITS:
        table = pq.read_table(entry / f"{split}.parquet")
        sources[split] = PromptSource([ray.put(table)], table.num_rows)
    log_counts(sources, manifest.counts)
    return PromptData(tokenizer, manifest, sources, template, cache_hit=True)


def write(data: PromptData, cache_dir: Path, key: str) -> Path:
    """``data``'s prompts (in Ray's object store) and manifest, written as ``key``'s entry and
    sealed; hold ``cache.locked(cache_dir, key)``."""
    tmp = cache.temporary_entry(cache_dir, key)
    tmp.mkdir(parents=True)
    for split, source in data.sources.items():
        pq.write_table(source.table(), tmp / f"{split}.parquet")
    (tmp / PROMPT_MANIFEST).write_text(json.dumps(asdict(data.manifest), indent=1))
    return cache.commit(tmp, data.stats, entry_problem)


def prompts_of(settings: Settings, corpus: Corpus,
               etl: Callable[[Tokenizer, ChatTemplate | None], PromptData]) -> PromptData:
    """The prompts from the cache's entry for their key, or from ``etl`` (Spark's run, given the
    tokenizer and template), its result then written as the entry. Not cached: with
    ``data.cache=false``, a ``data.query`` (its inputs are known once Spark plans it) or inputs
    without sizes and modification times."""
    tokenizer, template = prompt_tools(settings)
    cache_dir = _cache_dir(settings, corpus)
    if cache_dir is None:
        return etl(tokenizer, template)
    key = prompt_key(settings, corpus, template, prompt_limit(settings))
    with cache.locked(cache_dir, key):
        entry = cache.lookup(cache_dir, key, entry_problem)
        if entry is not None:
            return read(entry, tokenizer, template)
        data = etl(tokenizer, template)
        data.manifest.etl_key = key
        write(data, cache_dir, key)
    return data


def _cache_dir(settings: Settings, corpus: Corpus) -> Path | None:
    data = settings.data
    if not data.cache:
        return None
    if data.query is not None or not corpus.fingerprinted:
        log.info("ETL cache not used: the prompts' inputs are a query or files without a size "
                 "and modification time to key them by")
        return None
    if storage.is_s3(data.cache_dir):
        log.info("ETL cache not used for the prompts: their cache is local, data.cache_dir is "
                 "on S3")
        return None
    return Path(data.cache_dir)
