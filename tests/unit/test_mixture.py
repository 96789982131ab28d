"""A mixture's order (data/mixture.py): each source's share of every 100 steps within 1% of its
weight, the same batch with any number of workers, sources repeated epoch after epoch, and char
tokenizers made one; a bad mixture is one line."""

import functools

import numpy as np
import pytest

from helpers.chunks import chunked
from helpers.configs import make_config
from raydp_llm.core.checks import validate
from raydp_llm.core.config import source_settings
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer, train_bpe
from raydp_llm.data import windows
from raydp_llm.data.mixture import MixtureReader, MixtureSpec, one_tokenizer
from raydp_llm.data.stream import Sampling, SplitChunks
from raydp_llm.training.driver.mixed_data import check_repetitions

BLOCK, BATCH = 8, 16


def source(first_id: int, n: int) -> SplitChunks:
    """A source whose ``i``-th token is ``first_id + i``: its windows show where they came from
    (the sources' ids are disjoint)."""
    stream = (first_id + np.arange(n)).astype(np.uint32)
    segments_of = functools.partial(windows.segments, n=n, split="tail", val_fraction=0.1,
                                    seed=0, segment_tokens=4096)
    index, stored = chunked(stream, [n], segments_of, chunk_tokens=256, halo=16)
    return SplitChunks(stored["train"], index["train"])


@pytest.fixture(scope="module")
def parts():
    return [source(0, 20_000), source(100_000, 3_000)]  # the second repeats often


def reader(parts, weights, world=1, rank=0) -> tuple[MixtureReader, slice]:
    sampling = Sampling(BLOCK, BLOCK)
    spec = MixtureSpec(("domain", "replay"), tuple(weights),
                       tuple(sampling.windows(p.index) for p in parts), (None, None))
    mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    return MixtureReader(spec, parts, sampling, seed=3, dtypes=["uint32"] * 2, batch_size=BATCH,
                         capacity=BATCH + 2), mine


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.9, 0.1), (0.5, 0.5)])
def test_every_100_steps_hold_each_source_at_its_weight_within_1_percent(parts, weights):
    read, mine = reader(parts, weights)
    batches = [read.windows(step, mine, "uint32") for step in range(300)]
    for lo in (0, 100, 200):
        got = np.concatenate(batches[lo:lo + 100])
        share = (got[:, 0] < 100_000).mean()  # tokens of the first source
        assert abs(share - weights[0]) <= 0.01, (lo, share)


def test_a_steps_batch_is_the_same_with_any_number_of_workers_and_after_a_resume(parts):
    one, mine = reader(parts, (0.6, 0.4))
    whole = {step: one.windows(step, mine, "uint32") for step in (0, 5, 61, 400)}
    for world in (2, 4):
        for step, expected in whole.items():
            got = []
            for rank in range(world):
                read, part = reader(parts, (0.6, 0.4), world, rank)  # a fresh worker: a resume
                got.append(read.windows(step, part, "uint32"))
            assert np.array_equal(np.concatenate(got), expected)


def test_a_source_that_runs_out_starts_another_epoch_in_another_order(parts):
    read, mine = reader(parts, (0.5, 0.5))
    order = read.order
    per_epoch = order.per_epoch(1)
    steps = 3 * per_epoch // (BATCH // 2)  # about three epochs of the small source
    replay = []
    for step in range(steps):
        sources, _ = order.step(step)
        replay.append(read.windows(step, mine, "uint32")[sources == 1])
    replay = np.concatenate(replay)
    first, second = replay[:per_epoch, 0], replay[per_epoch:2 * per_epoch, 0]
    windows_of_source = order.windows[1]  # an epoch leaves out what its lanes cannot share
    assert per_epoch == windows_of_source // BATCH * BATCH
    for epoch in (first, second):
        assert len(np.unique(epoch)) == len(epoch)  # each window once in an epoch
    # the same windows again but for the few left out, in another order
    assert len(set(first.tolist()) & set(second.tolist())) >= 2 * per_epoch - windows_of_source
    assert first.tolist() != second.tolist()
    epochs = order.epochs(steps)
    assert epochs[1] == pytest.approx(len(replay) / per_epoch) and 2.5 < epochs[1] < 3.5


def test_char_sources_get_one_vocabulary_and_other_tokenizers_must_be_one():
    a, b = CharTokenizer("abc"), CharTokenizer("cxy")
    mixed, maps = one_tokenizer(["a", "b"], [a, b])
    assert mixed.chars == "abcxy"
    for tok, ids in zip((a, b), maps):
        text = tok.chars
        assert mixed.decode(np.asarray(ids)[tok.encode(text)]) == text
        assert ids[tok.eod_id] == mixed.eod_id
    same, none = one_tokenizer(["a", "b"], [a, CharTokenizer("cab")])
    assert same.chars == "abc" and none == [None, None]
    bpe = train_bpe([["hello world"] * 20], 280)
    with pytest.raises(InputError, match=r"^data.sources: b was encoded with another tokenizer"):
        one_tokenizer(["a", "b"], [a, bpe])


# ---- bad input: one line, before any engine --------------------------------------------------

TWO = "data.sources=[{name: a, path: /x.txt, weight: 0.7}, {name: b, path: /y.txt, weight: 0.3}]"


@pytest.mark.parametrize("overrides, line", [
    (["data.sources=[{name: a, weight: 0}]"],
     r"^data.sources.0.weight=0.0 is not allowed: use a number > 0$"),
    (["data.sources=[{name: a, weight: 1}, {name: a, weight: 2}]"],
     r"^data.sources: the name a is given to 2 sources; give each source its own name$"),
    ([TWO, "data.path=/z.txt"], r"^data.sources and data.path \(or data.query\) are both given"),
    ([TWO, "train.epochs=2"], r"^train.epochs=2: a mixture counts epochs per source"),
    ([TWO, "data.format=chat"], r"^data.sources: a has data.format=chat; a mixture blends"),
    ([TWO, "cluster.keep_executors=true"], r"^cluster.keep_executors=true: a mixture runs"),
])
def test_a_bad_mixture_is_one_line(overrides, line):
    with pytest.raises(InputError, match=line):
        validate(make_config(*overrides))


def test_a_mixture_that_repeats_a_source_too_often_is_refused():
    settings = make_config(TWO, "data.max_repetitions=2", "train.max_steps=100",
                           "train.batch_size=16")
    mixture = MixtureSpec(("a", "b"), (0.7, 0.3), (10_000, 160), (None, None))
    with pytest.raises(InputError, match=r"^data.max_repetitions=2: train.max_steps=100 trains "
                                         r"on source b 3.0 times \(160 windows\); set "
                                         r"data.max_repetitions=3"):
        check_repetitions(settings, mixture)
    check_repetitions(make_config(TWO, "data.max_repetitions=3", "train.max_steps=100",
                                  "train.batch_size=16"), mixture)  # 3.0 times: allowed


def test_a_sources_etl_settings_are_its_own_whatever_the_weights_or_the_other_sources():
    """A source's settings are what its ETL reads (and its cache key is made of): a new weight or
    another source changes none of them, so nothing is encoded again."""
    one = make_config(TWO, "data.text_column=body")
    other = make_config("data.sources=[{name: a, path: /x.txt, weight: 0.2}, {name: c, "
                        "path: /c.txt, weight: 0.8, format: parquet}]", "data.text_column=body")
    a = source_settings(one, one.data.sources[0])
    assert a == source_settings(other, other.data.sources[0])
    assert (a.data.path, a.data.sources, a.data.format) == ("/x.txt", [], "text")
    c = source_settings(other, other.data.sources[1])
    assert (c.data.format, c.data.text_column) == ("parquet", "body")

