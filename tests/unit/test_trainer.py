"""The trainer's data order (worker.WorkerData over data/stream.py): fixed by the seed, disjoint
across ranks, independent of the number of workers, resumable; and the learning-rate schedule."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from helpers.chunks import chunked
from raydp_llm.core.config import GPTConfig, OptimSettings, TrainSettings
from raydp_llm.data import windows
from raydp_llm.data.stream import Sampling, SplitChunks, steps_per_epoch
from raydp_llm.training.objectives.windows import WorkerData
from raydp_llm.training.spec import TrainSpec
from raydp_llm.training.worker.optim import lr_at

N, BLOCK = 1300, 12  # 1200 training tokens: 100 windows of 13 tokens at a stride of 12


@pytest.fixture(scope="module")
def data():
    """Token i = i, in three pieces and chunks of 200 tokens."""
    segments_of = functools.partial(windows.segments, n=N, split="tail", val_fraction=100 / N,
                                    seed=0, segment_tokens=8192)
    index, sources = chunked(np.arange(N, dtype=np.uint16), [500, 1, 799], segments_of, 200, 32)
    return {name: SplitChunks(sources[name], index[name]) for name in index}


def spec(data, seed: int = 7) -> TrainSpec:
    """12 windows per step over grad_accum 2, 100 steps with 10 of warmup."""
    sampling = {"train": Sampling(BLOCK, BLOCK), "val": Sampling(BLOCK, BLOCK)}
    return TrainSpec(
        model=GPTConfig(block_size=BLOCK),
        optim=OptimSettings(lr=1e-3, min_lr=1e-4, warmup_steps=10),
        train=TrainSettings(batch_size=12, grad_accum=2, max_steps=100, eval_batches=2),
        seed=seed,
        tokenizer_json="",
        token_dtype="uint16",
        chars_per_token=None,
        sampling=sampling,
        steps_per_epoch=steps_per_epoch(sampling["train"].windows(data["train"].index), 12),
        max_steps=100,
        fingerprint="x",
    )


def starts(data, s, epoch=0, first_step=0, rank=0, world=2) -> list[list[int]]:
    """Each step's windows on one rank, as the stream positions they start at."""
    groups = WorkerData(s, data, rank, world).steps(epoch, first_step)
    return [[int(w[0]) for micro in group for w in micro] for group in groups]


def test_each_rank_gets_its_own_micro_batches_in_a_seeded_order(data):
    s = spec(data)
    assert s.steps_per_epoch == 100 // 12 == 8 and s.micro_batch(world=2) == 3
    groups = WorkerData(s, data, 0, 2).steps(0, 0)
    assert all(len(g) == 2 and all(len(m) == 3 for m in g) for g in groups)  # grad_accum × micro
    rank0, rank1 = (starts(data, s, rank=r) for r in (0, 1))
    assert len(rank0) == len(rank1) == 8
    seen = [w for g in rank0 + rank1 for w in g]
    assert len(seen) == len(set(seen)) == 96 and seen != sorted(seen)  # disjoint, shuffled
    assert all(w % BLOCK == 0 and w + BLOCK < 1200 for w in seen)  # stride windows of the train
    assert starts(data, s, epoch=1) != rank0  # the epoch and the seed decide the order
    assert starts(data, spec(data, seed=8)) != rank0
    assert starts(data, s, first_step=5) == rank0[5:]  # a resumed epoch seeks to its step


@pytest.mark.parametrize("world", [1, 3, 6])
def test_each_step_trains_on_the_same_windows_with_any_number_of_workers(data, world):
    """What makes a resume with another number of workers (elastic, or train.num_workers changed)
    continue the same curve: step s takes the same batch_size windows, however they are split over
    ranks."""
    s = spec(data)
    two = [sorted(a + b) for a, b in zip(*(starts(data, s, rank=r) for r in (0, 1)))]
    per_rank = [starts(data, s, rank=r, world=world) for r in range(world)]
    assert [sorted(sum(parts, [])) for parts in zip(*per_rank)] == two
    assert starts(data, s, first_step=3, world=world) == per_rank[0][3:]


def test_validation_windows_are_shared_out_and_the_same_for_any_number_of_workers(data):
    s = spec(data)  # eval_batches=2 × 12 / grad_accum 2 = the first 12 validation windows at most
    for world in (1, 2, 3):
        got = sorted(int(w[0]) for rank in range(world)
                     for batch in WorkerData(s, data, rank, world).val_batches() for w in batch)
        assert got == [1200 + 12 * k for k in range(8)]  # 100 tokens: 8 windows of 13


def test_learning_rate_warms_up_then_decays_to_min_lr(data):
    s = spec(data)
    assert lr_at(0, s) == pytest.approx(1e-4) and lr_at(9, s) == pytest.approx(1e-3)
    assert lr_at(100, s) == pytest.approx(1e-4) and lr_at(55, s) == pytest.approx(5.5e-4)
    assert all(np.diff([lr_at(k, s) for k in range(10, 101)]) <= 0)


def test_start_up_phases_from_the_marks():
    from raydp_llm.training.driver.fit import startup_phases

    # the group started beside the ETL: 4.5 s of its start ran before the driver had the data
    marks = {"fit": 100.0, "loop_start": 104.5, "data_ready": 110.0, "data": 110.5,
             "worker_ready": 111.0, "first_step": 111.25, "last_step": 130.0, "fit_end": 133.0}
    assert startup_phases(marks) == {"train_group_start_s": 4.5, "data_wait_s": 6.0,
                                     "worker_setup_s": 0.5, "first_step_s": 0.25,
                                     "train_group_stop_s": 3.0, "overlapped_s": 4.5}
    # started once the data was there (a cache hit, or no room beside Spark): nothing overlapped,
    # and the data, there first, was not waited for
    late = marks | {"data_ready": 99.0, "data": 104.0}
    assert startup_phases(late) | {"overlapped_s": 0.0, "data_wait_s": 0.0} == startup_phases(late)
    assert startup_phases({"fit": 1.0, "fit_end": 2.0}) == {}  # nothing reached: nothing said


def test_start_up_timeline_from_the_marks():
    from raydp_llm.training.driver.fit import startup_timeline

    marks = {"fit": 100.0, "loop_start": 104.5, "data": 110.5, "worker_ready": 111.0}
    assert startup_timeline(marks, origin=90.0) == {"train_group_start": [10.0, 14.5],
                                                    "data_wait": [14.5, 20.5],
                                                    "worker_setup": [20.5, 21.0]}
