"""The curation kernels the executors run (minhash.py, quality.py, ngrams.py): exact keys, shingles,
MinHash and LSH banding, the quality measures, the contamination n-grams."""

from __future__ import annotations

import random

import numpy as np

from raydp_llm.data.etl.curation.minhash import (
    Banding,
    exact_key,
    jaccard,
    minhash,
    permutations,
    shingles,
)


def test_exact_keys_ignore_case_and_white_space_as_configured():
    assert exact_key("To be,\n  or NOT") == exact_key("to be, or not ")
    assert exact_key("To be", lower=False) != exact_key("to be", lower=False)
    assert exact_key("a  b", whitespace=False) != exact_key("a b", whitespace=False)


def test_minhash_estimates_jaccard_and_lsh_finds_close_pairs():
    rng = random.Random(0)
    a, b = permutations(128, seed=0)
    banding = Banding.for_threshold(0.8, 128)
    assert banding.bands * banding.rows <= 128
    words = [f"w{rng.randint(0, 5000)}" for _ in range(400)]
    errors, found = [], []
    for frac in (0.0, 0.01, 0.02, 0.1, 0.3):
        edited = list(words)
        for i in rng.sample(range(len(edited)), int(frac * len(edited))):
            edited[i] = f"x{rng.randint(0, 10**9)}"
        s1, s2 = shingles(" ".join(words), 5), shingles(" ".join(edited), 5)
        m1, m2 = minhash(s1, a, b), minhash(s2, a, b)
        errors.append(abs(float((m1 == m2).mean()) - jaccard(s1, s2)))
        found.append(bool(set(banding.keys(m1)) & set(banding.keys(m2))))
    assert max(errors) < 0.1  # 128 permutations: standard error ~0.04
    assert found == [True, True, True, False, False]
    # the same everywhere: no per-process hash seed
    assert minhash(shingles("the same text", 2), a, b).tolist() == minhash(
        shingles("the same text", 2), *permutations(128, seed=0)).tolist()
    assert np.array_equal(shingles("abc", 5, unit="char"), shingles("ABC", 5, unit="char"))


def test_gopher_measures_of_boilerplate_and_prose():
    from raydp_llm.data.etl.curation.quality import quality

    prose = ("Whether 'tis nobler in the mind to suffer the slings and arrows of outrageous "
             "fortune, or to take arms against a sea of troubles and by opposing end them.")
    q = quality(prose)
    assert q["words"] == 29 and 3 < q["mean_word_length"] < 10
    assert q["dup_lines"] == 0 and q["dup_10gram_chars"] == 0 and q["alpha_words"] == 1
    spam = "\n".join(["• Click here to subscribe now ..."] * 10)
    q = quality(spam)
    assert q["bullet_lines"] == 1 and q["ellipsis_lines"] == 1 and q["dup_lines"] == 0.9
    assert q["dup_5gram_chars"] > 0.9 and q["top_2gram_chars"] > 0.2


def test_every_curation_setting_and_the_score_files_content_are_in_the_etl_cache_key(tmp_path):
    from helpers.configs import make_config
    from raydp_llm.data.cache import cache_key
    from raydp_llm.data.inputs.files import sample_corpus

    corpus = sample_corpus()

    def key(*overrides):
        cfg = make_config(*overrides)
        return cache_key(corpus, cfg.data, cfg.tokenizer, cfg.seed)

    scores = tmp_path / "scores.parquet"
    scores.write_bytes(b"one")
    with_scores = (f"data.filters.score_path={scores}", "data.filters.max_score=3")
    keys = [key(), key("data.dedup=exact"), key("data.dedup=near"),
            key("data.dedup=near", "data.dedup_threshold=0.7"), key("data.filters.min_words=50"),
            key("data.decontaminate=remove"), key("data.decontaminate_ngram=8"),
            key(*with_scores)]
    scores.write_bytes(b"two")
    keys.append(key(*with_scores))
    assert len(set(keys)) == len(keys)


def test_word_ngrams_are_hashed_alike_everywhere_and_ignore_case_and_punctuation():
    from raydp_llm.data.etl.curation.ngrams import ngrams

    text = "It is a truth universally acknowledged, that a single man in possession"
    assert ngrams(text, 13).size == 0  # 12 words
    assert ngrams(text + " of", 13).size == 1
    assert np.array_equal(ngrams(text.upper() + "  OF!", 13), ngrams(text + " of", 13))
    assert ngrams("a b c a b c a b", 3).size == 3  # distinct: abc, bca, cab
    assert not set(ngrams(text + " of", 13)) & set(ngrams(text + " off", 13))


def _line_batches(docs: list[list[str]], cut: int) -> list:
    """The lines of ``docs`` (document ``i`` has id ``100 + i``) as Arrow batches, a blank line
    (``doc = -1``) between documents, cut into two batches after ``cut`` rows."""
    import pyarrow as pa

    rows = []
    for i, lines in enumerate(docs):
        rows += [(i, 100 + i, line.encode()) for line in lines] + [(-1, 0, b"")]
    doc, ids, raw = zip(*rows)
    batch = pa.RecordBatch.from_pydict({"doc": list(doc), "id": list(ids), "raw": list(raw)})
    return [batch.slice(0, cut), batch.slice(cut)]


def test_the_ngram_pass_joins_a_documents_lines_across_batches_and_never_two_documents():
    from raydp_llm.data.etl.curation.contamination import LineGrams
    from raydp_llm.data.etl.curation.ngrams import ngrams

    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(40)]
    docs = [[" ".join(rng.choices(vocab, k=rng.randint(0, 6))) for _ in range(rng.randint(1, 9))]
            for _ in range(12)]
    expected = {(100 + i, int(g)) for i, lines in enumerate(docs)
                for g in ngrams(" ".join(lines), 3).view(np.int64)}
    total = sum(len(lines) + 1 for lines in docs)
    for cut in (0, 1, 7, total // 2, total - 1):
        out = [b for b in LineGrams(3)(_line_batches(docs, cut))]
        got = {(i, g) for b in out for i, g in zip(b.column("id").to_pylist(),
                                                   b.column("gram").to_pylist())}
        assert got == expected, cut


def test_a_bloom_filter_holds_what_was_added_and_little_else():
    from raydp_llm.data.etl.curation.ngrams import Bloom

    rng = np.random.default_rng(0)
    added = rng.integers(0, 2**63, 50_000).astype(np.uint64)
    first, second = Bloom.empty(added.size), Bloom.empty(added.size)
    first.add(added[:25_000])
    second.add(added[25_000:])
    bloom = first.union(second)  # as the executors merge their partitions' filters
    assert bloom.may_hold(added).all()
    others = np.arange(1, 200_001, dtype=np.uint64)  # consecutive values: hashing must mix them
    assert bloom.may_hold(others).mean() < 0.015  # 10 bits and 7 probes per value: 0.8%


def test_the_measure_pass_writes_one_schema_whatever_a_batch_holds():
    """A batch where no document fails a filter has no rule at all: its column must still be text
    (a 100 MB ETL failed on "record batch with different schema")."""
    import pyarrow as pa

    from helpers.configs import make_config
    from raydp_llm.data.etl.curation.curate import Measure

    measure = Measure.of(make_config("data.filters.min_words=3", "data.dedup=near").data, 0)

    def batch(text: bytes) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"src": ["a"], "doc": [0],
                                           "lines": [[{"line": 0, "raw": text}]]})

    passing, failing = measure([batch(b"three whole words"), batch(b"two words")])
    assert passing.column("rule").to_pylist() == [None]
    assert failing.column("rule").to_pylist() == ["min_words"]
    assert passing.schema == failing.schema


def test_the_exact_checks_training_pass_returns_each_document_and_n_gram_once():
    """Text repeated in many training documents (and twice in one) gives one id per document and
    one bit per validation n-gram, not a row per occurrence."""
    from types import SimpleNamespace

    from raydp_llm.data.etl.curation.contamination import GramSet, TrainHits
    from raydp_llm.data.etl.curation.ngrams import ngrams

    val_text = "the quick brown fox jumps over the lazy dog"
    docs = [[val_text], [val_text, "and " + val_text], ["nothing of it here at all"],
            ["then: " + val_text]]  # 100 is the validation document
    known = np.unique(ngrams(val_text, 3).view(np.int64))
    hits = TrainHits(3, SimpleNamespace(value=np.array([100])),
                     SimpleNamespace(value=GramSet(known)))
    for cut in (0, 2, 5):
        [row] = list(hits(_line_batches(docs, cut)))
        ids = np.frombuffer(row.column("id")[0].as_py(), np.int64)
        seen = np.unpackbits(np.frombuffer(row.column("seen")[0].as_py(), np.uint8),
                             count=known.size)
        assert ids.tolist() == [101, 103] and seen.all(), cut
