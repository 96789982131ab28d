"""The ETL's two hand-offs, side by side: its chunks written from the executors as a cache entry's
Parquet files (``to_parquet``: a row group per chunk, staged under a temporary name for
``cache.commit`` to seal and put in place; ``to_s3``: a new attempt at an entry on S3), or handed
to Ray's object store (``to_object_store``: ``ray.data.from_spark``, a block per chunk). Either way
the chunks are sorted by start and counted against the chunk arithmetic before anyone trains on
them."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from raydp_llm.core import storage
from raydp_llm.core.storage import S3Options
from raydp_llm.data import cache, s3_cache, stream
from raydp_llm.data.etl.records import EtlOutput
from raydp_llm.data.stream import BlockChunks, ChunkIndex
from raydp_llm.engines import raydp_fixes

CHUNKS_PER_FILE = 64  # Parquet files of ~32 MB at the default chunk size


def to_parquet(out: EtlOutput, cache_dir: Path, key: str) -> Path:
    """Write the chunks from the executors (sorted, a row group per chunk), then the rest of the
    entry (``write_the_rest``), under a temporary name; ``cache.commit`` puts it in place. Hold
    ``cache.locked(cache_dir, key)``."""
    tmp = cache.temporary_entry(cache_dir, key)
    row_group = out.manifest.chunk_tokens * np.dtype(out.manifest.token_dtype).itemsize
    try:
        for name, df in out.chunks.items():
            # parquet-mr closes a row group once it holds parquet.block.size bytes, checked after
            # every row (page.size.row.check.min=1): a worker reads its chunks and no more
            (sorted_chunks(df, len(out.index[name]), CHUNKS_PER_FILE).write
             .option("parquet.block.size", row_group)
             .option("parquet.page.size.row.check.min", 1)
             .parquet(str(tmp / name)))
            check_chunk_count(
                name,
                sum(pq.ParquetFile(f).metadata.num_rows for f in (tmp / name).glob("*.parquet")),
                out.index[name],
            )
        write_the_rest(out, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def to_s3(out: EtlOutput, cache_dir: str, key: str, s3: S3Options) -> s3_cache.Staged:
    """``to_parquet`` for a cache on S3 (``s3_cache``): the executors write the chunks straight
    into a new attempt at ``key``'s entry (``write_from_executors``), the driver the rest into a
    local directory that ``Staged.commit`` uploads and seals."""
    staged = s3_cache.new_attempt(cache_dir, key, s3)
    try:
        for name, df in out.chunks.items():
            rows = write_from_executors(sorted_chunks(df, len(out.index[name]), CHUNKS_PER_FILE),
                                        storage.join(staged.uri, name), s3, rows_per_group=1)
            check_chunk_count(name, rows, out.index[name])
        write_the_rest(out, staged.local, lambda df, name: write_from_executors(
            df, storage.join(staged.uri, name), s3))
    except BaseException:
        staged.discard()
        raise
    return staged


def write_from_executors(df: DataFrame, uri: str, s3: S3Options,
                         rows_per_group: int | None = None) -> int:
    """Each partition of ``df`` as a Parquet file under ``uri``, written by the executor that holds
    it through pyarrow (this Spark has no S3 connector for its own writer), ``rows_per_group`` rows
    to a row group (None: pyarrow's); files named by partition, so in ``df``'s order. Returns the
    rows written (a task Spark runs again writes its file again, whole)."""

    def write(batches):
        from pyspark import TaskContext

        batches = [batch for batch in batches if batch.num_rows]
        if batches:
            fs, root = storage.resolve(uri, s3)
            part = TaskContext.get().partitionId()
            with fs.open_output_stream(f"{root}/part-{part:05d}.parquet") as f:
                pq.write_table(pa.Table.from_batches(batches), f, row_group_size=rows_per_group)
        yield pa.RecordBatch.from_pydict({"rows": [sum(batch.num_rows for batch in batches)]})

    return sum(row.rows for row in df.mapInArrow(write, "rows long").collect())


def write_the_rest(out: EtlOutput, entry: Path, write_frame=None) -> None:
    """An entry's files beside its chunks, into ``entry``: the chunks' index, the tokenizer, the
    manifest; each document's place in the token stream (``documents/``: what ``evaluate
    per_document=true`` scores), and what curation removed (``removed/``: path, document, bytes,
    reason, the kept copy of a duplicate; ``removed_sample.json``: a few, with their text).
    ``write_frame(df, name)``: how the Parquet directories are written (Spark's writer into
    ``entry`` when None)."""
    stream.write_index(entry, out.index)
    out.tokenizer.save(entry)
    (entry / cache.MANIFEST).write_text(json.dumps(out.manifest.to_json(), indent=2))
    if write_frame is None:
        def write_frame(df, name):
            df.write.parquet(str(entry / name))
    if out.documents is not None:
        write_frame(out.documents.withColumnRenamed("src", "path").orderBy("start"),
                    cache.DOCUMENTS)
    if out.removed is not None:
        write_frame(out.removed.withColumnRenamed("src", "path").orderBy("path", "doc"),
                    cache.REMOVED)
        (entry / cache.REMOVED_SAMPLE).write_text(json.dumps(out.removed_sample, indent=2))


def to_object_store(out: EtlOutput) -> dict[str, BlockChunks]:
    """Hand the chunks to Ray (``ray.data.from_spark``, a block per chunk), then release Spark's
    cached copy. The blocks are materialized in the object store, owned by this driver, so they
    outlive Spark; each worker later fetches only the blocks of its own chunks."""
    import ray.data
    from raydp.spark import release_spark_recoverable

    raydp_fixes.install()
    sources = {}
    for name, df in out.chunks.items():
        df = sorted_chunks(df, len(out.index[name]), per_partition=1)
        dataset = ray.data.from_spark(df).materialize()
        release_spark_recoverable(df)
        check_chunk_count(name, dataset.count(), out.index[name])
        sources[name] = BlockChunks(dataset.to_arrow_refs(), out.index[name])
    out.encoded.unpersist()
    return sources


INLINE = "inline"  # blocks Ray keeps in their owner's memory (the driver's), not an object store


def held_per_node(sources: dict[str, BlockChunks]) -> dict[str, int]:
    """Bytes of the handed-over chunks in each node's object store, by Ray node id (a block held
    on two nodes counts on both), and under ``INLINE`` those Ray keeps in the driver's memory
    (objects under 100 KiB): where a lost node's share must be rebuilt from, and whether the data
    gathered on one node (docs/deploy-emr.md)."""
    import ray.experimental

    refs = [ref for source in sources.values() for ref in source.refs]
    held: dict[str, int] = {}
    for where in ray.experimental.get_object_locations(refs).values():
        for node in where["node_ids"] or [INLINE]:
            held[node] = held.get(node, 0) + (where["object_size"] or 0)
    return held


def sorted_chunks(df: DataFrame, chunks: int, per_partition: int) -> DataFrame:
    """The chunk rows sorted by start, ``per_partition`` chunks to a partition (a Ray block, or a
    Parquet file), partitions in stream order."""
    parts = max(1, math.ceil(chunks / per_partition))
    return df.repartitionByRange(parts, "start").sortWithinPartitions("start")


def check_chunk_count(name: str, count: int, index: ChunkIndex) -> None:
    """Spark's output against the chunk arithmetic: a mismatch is a bug, never silently trained
    on."""
    if count != len(index):
        raise RuntimeError(f"chunk count mismatch in {name}: Spark cut {count}, the arithmetic "
                           f"says {len(index)}")
