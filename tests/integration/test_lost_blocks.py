"""Blocks of the hand-off lost (``data.cache=false``), made again while the workers wait, on the
session's Ray: a block whose making fails when Ray would make it again (as RayDP's fetch does once
Spark has stopped: test_multinode loses a real node) is asked for by two workers at once, the
driver runs its ``remake`` once, and both read every chunk's tokens from the new blocks; a remake
that fails, or cuts other chunks, ends the workers with one line."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
import ray

from raydp_llm.data.stream import BlockChunks, ChunkIndex, SplitChunks
from raydp_llm.training.driver.lost_blocks import BlockRebuilds
from raydp_llm.training.handoff import Handoff

pytestmark = pytest.mark.integration

CHUNK = 4  # tokens (bytes here) a chunk
INDEX = ChunkIndex.of([(c * CHUNK, CHUNK, 0, 3 * CHUNK) for c in range(3)])


def _blocks(tag: bytes) -> list:
    """A block per chunk: its start and its tokens (``tag`` and the chunk's number)."""
    return [ray.put(pa.table({"start": [c * CHUNK], "tokens": [tag + bytes([c]) * 3]}))
            for c in range(3)]


@ray.remote(num_cpus=0)
def _never_again() -> pa.Table:
    raise ValueError("Failed to look up actor with name 'raydp-executor-1'")  # RayDP's, gone


@ray.remote(num_cpus=0)
def _read_every_chunk(box: list) -> list[bytes] | str:
    """A worker: every chunk of the train split it was handed, or the one line it failed with."""
    source = ray.get(box[0])["train"].source
    try:
        return [source.fetch(c, int(INDEX.start[c])) for c in range(3)]
    except RuntimeError as err:
        return str(err)


def _run(remake) -> tuple[list, BlockRebuilds]:
    """Two workers reading the data whose block 1 is lost, the driver following them."""
    first = BlockChunks(_blocks(b"a"), INDEX)
    first.refs[1] = _never_again.remote()  # lost, and not to be made by Ray
    rebuilds = BlockRebuilds(Handoff.remote(), {"train": SplitChunks(first, INDEX)}, remake)
    box = [ray.put({"train": SplitChunks(first, INDEX)})]  # as the delivery carries it
    read: list = []
    fit = threading.Thread(target=lambda: read.extend(
        ray.get([_read_every_chunk.remote(box) for _ in range(2)])))
    fit.start()
    rebuilds.follow(fit)
    return read, rebuilds


def test_a_lost_block_is_made_again_once_for_every_worker_that_waits(ray_cluster):
    calls = []

    def remake() -> dict:
        calls.append(1)
        return {"train": SplitChunks(BlockChunks(_blocks(b"b"), INDEX), INDEX)}

    read, rebuilds = _run(remake)
    # chunk 0 from the first blocks, then (block 1 lost) every later one from the new blocks
    assert read == [[b"a\x00\x00\x00", b"b\x01\x01\x01", b"b\x02\x02\x02"]] * 2
    assert len(calls) == 1
    (made,) = rebuilds.rebuilds
    assert made["made"] and "raydp-executor-1" in made["why"], made


@pytest.mark.parametrize("index", [INDEX, ChunkIndex.of([(0, 12, 0, 12)])],
                         ids=["remake-fails", "other-chunks"])
def test_blocks_not_made_again_end_the_workers_with_one_line(ray_cluster, index):
    def remake() -> dict:
        if index is INDEX:
            raise OSError("Spark could not start")
        return {"train": SplitChunks(BlockChunks(_blocks(b"b")[:1], index), index)}

    read, rebuilds = _run(remake)
    assert len(read) == 2 and all(isinstance(line, str) and "\n" not in line for line in read)
    assert read[0].startswith("blocks of the hand-off were lost (ValueError: Failed to look up "
                              "actor with name 'raydp-executor-1')")
    assert "could not be made again" in read[0]
    assert [r["made"] for r in rebuilds.rebuilds] == [False]
    assert np.array_equal(INDEX.start, [0, 4, 8])
