"""Deduplication's kernels, run per document inside Spark's executors (curate.py): exact-duplicate
keys, shingles, MinHash signatures and their LSH bands. Pure numpy and hashlib: deterministic across
processes and machines (no ``hash()``, whose seed differs per process).

Near duplicates follow Broder (1997) and the MinHash/LSH set-up of the GPT-3, Gopher and RefinedWeb
pipelines: a document is the set of its shingles (``n`` consecutive words or characters), MinHash
estimates the Jaccard similarity of two sets from ``num_perm`` minima, and LSH splits the signature
into ``bands`` of ``rows``: two documents that agree on a whole band become candidates.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from dataclasses import dataclass

import numpy as np

PRIME = (1 << 31) - 1  # the universal hash family's modulus: (a*x + b) mod p fits in uint64
_WORDS = re.compile(r"\w+", re.UNICODE)
_SPACES = re.compile(r"\s+")


def normalize(text: str, lower: bool = True, whitespace: bool = True) -> str:
    """The text exact deduplication compares: case folded (``lower``), runs of white space made one
    space and the ends stripped (``whitespace``)."""
    if lower:
        text = text.casefold()
    if whitespace:
        text = _SPACES.sub(" ", text).strip()
    return text


def exact_key(text: str, lower: bool = True, whitespace: bool = True) -> bytes:
    """16 bytes that equal documents (after ``normalize``) share: BLAKE2b of the normalized text."""
    normal = normalize(text, lower, whitespace).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(normal, digest_size=16).digest()


def shingles(text: str, n: int, unit: str = "word") -> np.ndarray:
    """The distinct ``n``-shingles of a document, as 32-bit hashes: ``n`` consecutive words
    (lower case, ``\\w+``) or characters. A document shorter than ``n`` is one shingle."""
    if unit == "word":
        tokens = [w.encode("utf-8", "surrogatepass") for w in _WORDS.findall(text.casefold())]
        grams = [b" ".join(tokens[i:i + n]) for i in range(max(1, len(tokens) - n + 1))]
    else:
        data = text.casefold()
        grams = [data[i:i + n].encode("utf-8", "surrogatepass")
                 for i in range(max(1, len(data) - n + 1))]
    return np.unique(np.fromiter((zlib.crc32(g) for g in grams), np.uint64, len(grams)))


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(a, b)`` of ``num_perm`` universal hash functions, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return (rng.integers(1, PRIME, num_perm, dtype=np.uint64),
            rng.integers(0, PRIME, num_perm, dtype=np.uint64))


def minhash(hashes: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A document's MinHash signature: for each hash function, the least ``(a*x + b) mod p`` over
    its shingles ``x`` (uint32 each)."""
    if hashes.size == 0:
        return np.full(a.size, PRIME, np.uint32)
    x = hashes.astype(np.uint64) % PRIME
    values = (np.outer(x, a) + b) % PRIME  # shingles × num_perm; a*x < 2^62
    return values.min(axis=0).astype(np.uint32)


@dataclass(frozen=True)
class Banding:
    """``bands`` bands of ``rows`` signature values each (``bands * rows <= num_perm``)."""

    bands: int
    rows: int

    @classmethod
    def for_threshold(cls, threshold: float, num_perm: int, fp_weight: float = 0.1) -> Banding:
        """The banding whose S-curve ``1 - (1 - s^r)^b`` best separates Jaccard similarities above
        ``threshold`` from those below: the least weighted sum of the false positive and false
        negative areas (datasketch's ``optimal_param``). Candidates are verified afterwards, so a
        false positive costs only a comparison: missed pairs weigh 9 times more (at 0.8 and 128
        functions: 14 bands of 9 rows, a pair at 0.85 is a candidate with p = 0.975)."""
        best, best_cost = None, math.inf
        for bands in range(1, num_perm + 1):
            for rows in range(1, num_perm // bands + 1):
                cost = (fp_weight * _area(threshold, bands, rows, below=True)
                        + (1 - fp_weight) * _area(threshold, bands, rows, below=False))
                if cost < best_cost:
                    best, best_cost = cls(bands, rows), cost
        return best

    def keys(self, signature: np.ndarray) -> list[bytes]:
        """One key per band: the band's index and values, hashed (two documents sharing a key are
        candidates)."""
        rows = signature[: self.bands * self.rows].reshape(self.bands, self.rows)
        return [hashlib.blake2b(np.uint32(i).tobytes() + row.tobytes(), digest_size=12).digest()
                for i, row in enumerate(rows)]


def _area(threshold: float, bands: int, rows: int, below: bool, steps: int = 200) -> float:
    """The area under (false positives, below the threshold) or above (false negatives) the
    candidate probability curve, by the midpoint rule."""
    lo, hi = (0.0, threshold) if below else (threshold, 1.0)
    width = (hi - lo) / steps
    total = 0.0
    for i in range(steps):
        s = lo + (i + 0.5) * width
        p = 1 - (1 - s ** rows) ** bands
        total += (p if below else 1 - p) * width
    return total


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """The Jaccard similarity of two shingle sets (sorted, distinct hashes)."""
    union = np.union1d(a, b).size
    return np.intersect1d(a, b, assume_unique=True).size / union if union else 1.0
