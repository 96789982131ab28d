"""The trainer's data order: fixed by the seed, disjoint across ranks, independent of Ray's blocks
and of the number of workers, resumable."""

from __future__ import annotations

import numpy as np
import pytest

from raydp_llm.core.config import GPTConfig, OptimSettings, TrainSettings
from raydp_llm.training.spec import TrainSpec, steps_per_epoch
from raydp_llm.training.trainer import epoch_steps, lr_at

pytestmark = pytest.mark.integration  # real Ray Data iterators


def spec(seed: int = 7) -> TrainSpec:
    """The spec of 100 windows, 12 per step over grad_accum 2, 100 steps with 10 of warmup."""
    train = TrainSettings(batch_size=12, grad_accum=2, max_steps=100, shuffle_buffer=16)
    return TrainSpec(
        model=GPTConfig(),
        optim=OptimSettings(lr=1e-3, min_lr=1e-4, warmup_steps=10),
        train=train,
        seed=seed,
        tokenizer_json="",
        token_dtype="uint16",
        chars_per_token=None,
        steps_per_epoch=steps_per_epoch(100, 12),
        max_steps=100,
        fingerprint="x",
    )


def stream(blocks: int):
    import ray.data

    items = [{"tokens": i.to_bytes(2, "little")} for i in range(100)]
    return ray.data.from_items(items, override_num_blocks=blocks).materialize().iterator()


def ids(steps) -> list[list[int]]:
    return [[int.from_bytes(w, "little") for mb in group for w in mb] for group in steps]


def test_each_rank_gets_its_own_micro_batches_in_a_seeded_order(ray_cluster):
    s = spec()
    assert s.steps_per_epoch == 100 // 12 == 8 and s.micro_batch(world=2) == 3
    rank0, rank1 = (
        ids(epoch_steps(stream(5), s, epoch=0, first_step=0, rank=r, world=2)) for r in (0, 1)
    )
    assert len(rank0) == len(rank1) == 8 and all(
        len(g) == 6 for g in rank0 + rank1
    )  # grad_accum × micro_batch
    seen = [w for g in rank0 + rank1 for w in g]
    assert len(seen) == len(set(seen)) == 96 and seen != sorted(seen)  # disjoint, shuffled
    # Ray's blocks do not matter; the seed and the epoch do.
    assert ids(epoch_steps(stream(1), s, 0, 0, 0, 2)) == rank0
    assert ids(epoch_steps(stream(5), s, 1, 0, 0, 2)) != rank0
    assert ids(epoch_steps(stream(5), spec(seed=8), 0, 0, 0, 2)) != rank0
    # A resumed epoch skips exactly the steps already taken.
    assert ids(epoch_steps(stream(3), s, 0, 5, 0, 2)) == rank0[5:]


@pytest.mark.parametrize("world", [1, 3, 6])
def test_each_step_trains_on_the_same_windows_with_any_number_of_workers(ray_cluster, world):
    """What makes a resume with another number of workers (elastic, or train.num_workers changed)
    continue the same curve: step s takes the same batch_size windows of the seeded stream, however
    they are split over ranks."""
    s = spec()
    two = [
        sorted(a + b) for a, b in zip(*(ids(epoch_steps(stream(5), s, 0, 0, r, 2)) for r in (0, 1)))
    ]
    per_rank = [ids(epoch_steps(stream(2), s, 0, 0, r, world)) for r in range(world)]
    assert [sorted(sum(parts, [])) for parts in zip(*per_rank)] == two
    assert (
        ids(epoch_steps(stream(2), s, 0, 3, 0, world)) == per_rank[0][3:]
    )  # and resumes at the same step


def test_learning_rate_warms_up_then_decays_to_min_lr():
    s = spec()
    assert lr_at(0, s) == pytest.approx(1e-4) and lr_at(9, s) == pytest.approx(1e-3)
    assert lr_at(100, s) == pytest.approx(1e-4) and lr_at(55, s) == pytest.approx(5.5e-4)
    assert all(np.diff([lr_at(k, s) for k in range(10, 101)]) <= 0)
