"""The ETL cache: windows (Parquet), tokenizer and manifest under ``data.cache_dir/<key>/``.

The key hashes the inputs' fingerprints (paths, sizes, modification times) and every setting the ETL
reads. An entry is written under a temporary name and renamed into place when complete, so a crash
mid-write never leaves an entry that a later run would use.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

from raydp_llm.corpus import Corpus
from raydp_llm.etl import EtlOutput, check_window_count
from raydp_llm.tokenizer import Tokenizer, load_tokenizer

MANIFEST = "manifest.json"
ETL_VERSION = 2  # bump when the ETL's output changes for the same inputs and settings


def cache_key(corpus: Corpus, data: DictConfig, tok_cfg: DictConfig, block_size: int, seed: int) -> str:
    settings = OmegaConf.to_container(data, resolve=True)
    for irrelevant in ("cache", "cache_dir", "path", "max_files"):  # the inputs are in the fingerprints
        settings.pop(irrelevant, None)
    tokenizer = OmegaConf.to_container(tok_cfg, resolve=True)
    if tok_cfg.get("path"):
        tokenizer["file_sha256"] = hashlib.sha256(Path(tok_cfg.path).read_bytes()).hexdigest()
    blob = json.dumps({"version": ETL_VERSION, "inputs": corpus.fingerprints, "markdown": corpus.markdown,
                       "data": settings, "tokenizer": tokenizer, "block_size": block_size, "seed": seed},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def lookup(cache_dir: Path, key: str) -> Path | None:
    """The complete entry for ``key``, or None."""
    entry = Path(cache_dir) / key
    return entry if (entry / MANIFEST).is_file() else None


def write_entry(out: EtlOutput, cache_dir: Path, key: str) -> Path:
    """Write the windows from the executors, then the tokenizer and manifest; rename into place."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".{key}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        for name, df in (("train", out.train), ("val", out.val)):
            df.write.parquet(str(tmp / name))
            check_window_count(name, sum(pq.ParquetFile(f).metadata.num_rows for f in (tmp / name).glob("*.parquet")),
                               out.manifest)
        out.tokenizer.save(tmp)
        (tmp / MANIFEST).write_text(json.dumps(out.manifest, indent=2))
        final = cache_dir / key
        if final.exists():  # written meanwhile by another run with the same key: keep that one
            shutil.rmtree(tmp)
        else:
            tmp.rename(final)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_entry(entry: Path, to_ray: bool) -> tuple[dict | None, Tokenizer, dict]:
    """The tokenizer, the manifest and, when ``to_ray``, the windows as Ray datasets (``read_parquet``)."""
    datasets = None
    if to_ray:
        import ray.data

        datasets = {name: ray.data.read_parquet(str(entry / name)).materialize() for name in ("train", "val")}
    return datasets, load_tokenizer(entry), json.loads((entry / MANIFEST).read_text())
