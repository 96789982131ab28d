"""The curation pieces the executors run: exact keys, shingles, MinHash and LSH banding."""

from __future__ import annotations

import random

import numpy as np

from raydp_llm.data.curation import (
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
    from raydp_llm.data.curation import quality

    prose = ("Whether 'tis nobler in the mind to suffer the slings and arrows of outrageous "
             "fortune, or to take arms against a sea of troubles and by opposing end them.")
    q = quality(prose)
    assert q["words"] == 29 and 3 < q["mean_word_length"] < 10
    assert q["dup_lines"] == 0 and q["dup_10gram_chars"] == 0 and q["alpha_words"] == 1
    spam = "\n".join(["• Click here to subscribe now ..."] * 10)
    q = quality(spam)
    assert q["bullet_lines"] == 1 and q["ellipsis_lines"] == 1 and q["dup_lines"] == 0.9
    assert q["dup_5gram_chars"] > 0.9 and q["top_2gram_chars"] > 0.2
