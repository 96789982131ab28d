"""The contamination check's kernels (contamination.py), run inside Spark's executors: word n-grams
hashed to 64 bits, vectorised over a batch's bytes, and the Bloom filter of the validation side's
n-grams. Pure numpy: deterministic across processes and machines."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_GRAM_BASE = np.uint64(1099511628211)  # FNV's 64-bit prime: the n-gram hash's polynomial base


def ngrams(text: str, n: int) -> np.ndarray:
    """The distinct word ``n``-grams of a text (``byte_words``: case and punctuation ignored, as
    GPT-3's check normalized them) as 64-bit hashes; none when it has fewer than ``n`` words."""
    return np.unique(rolling(byte_words(text.encode("utf-8", "surrogatepass"))[0], n))


def rolling(hashes: np.ndarray, n: int) -> np.ndarray:
    """The hash of every ``n`` consecutive word hashes (a polynomial in ``_GRAM_BASE`` modulo
    2^64), in order."""
    if len(hashes) < n:
        return np.empty(0, np.uint64)
    grams = np.zeros(len(hashes) - n + 1, np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2^64
        for i in range(n):
            grams = grams * _GRAM_BASE + hashes[i:len(hashes) - n + 1 + i]
    return grams


_BYTE_BASE = np.uint64(0x100000001B3)  # the word hash's polynomial base (odd: invertible)
_BYTE_BASE_INVERSE = np.uint64(pow(0x100000001B3, -1, 1 << 64))
# the bytes of words: ASCII letters, digits, underscore, and every byte of a non-ASCII character
_WORD_BYTE = np.array([chr(b).isalnum() or b == ord("_") or b >= 0x80 for b in range(256)])


def byte_words(text: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The words of UTF-8 ``text`` with ASCII letters lower-cased, vectorised: runs of word bytes
    (ASCII letters, digits, ``_``, any non-ASCII character). Returns each word's 64-bit hash and
    its start, in order. A polynomial hash of the bytes from prefix sums (``H[i] = P^i ·
    Σ_{j<i} b_j P^-j`` modulo 2^64), then mixed: about 20 ns a byte, where hashing word by word in
    Python costs a microsecond a word."""
    data = np.frombuffer(text.lower(), np.uint8)
    edges = np.diff(np.concatenate([[False], _WORD_BYTE[data], [False]]).astype(np.int8))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if not starts.size:
        return np.empty(0, np.uint64), starts
    with np.errstate(over="ignore"):  # arithmetic modulo 2^64
        powers = np.cumprod(np.full(data.size + 1, _BYTE_BASE, np.uint64))
        powers[1:], powers[0] = powers[:-1], np.uint64(1)  # P^0 .. P^n
        inverse = np.cumprod(np.full(data.size, _BYTE_BASE_INVERSE, np.uint64))
        inverse[1:], inverse[0] = inverse[:-1], np.uint64(1)  # P^-0 .. P^-(n-1)
        sums = np.concatenate([[np.uint64(0)], np.cumsum(data.astype(np.uint64) * inverse)])
        # Σ_{start<=j<end} b_j P^(end-1-j) = P^(end-1) · (S[end] - S[start])
        hashes = powers[ends - 1] * (sums[ends] - sums[starts]) + np.uint64(ends - starts)
    return _mix(hashes), starts


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: every output bit depends on every input bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@dataclass
class Bloom:
    """A Bloom filter of 64-bit hashes (Bloom 1970): ``bits`` bits, ``hashes`` probes each (double
    hashing, Kirsch and Mitzenmacher 2006). ``may_hold`` never misses an added value and answers
    yes for a value never added with probability about ``(1 - e^(-hashes*n/bits))^hashes``:
    0.8% at 10 bits and 7 probes per value."""

    bits: np.ndarray  # uint8, bits // 8 bytes
    hashes: int = 7

    @classmethod
    def empty(cls, items: int, bits_per_item: int = 10, hashes: int = 7) -> Bloom:
        return cls(np.zeros(max(8, (items * bits_per_item + 7) // 8), np.uint8), hashes)

    def _probes(self, values: np.ndarray) -> np.ndarray:
        """values × hashes bit positions."""
        mixed = _mix(values.astype(np.uint64))
        low, high = mixed & np.uint64(0xFFFFFFFF), (mixed >> np.uint64(32)) | np.uint64(1)
        steps = np.arange(self.hashes, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return (low[:, None] + steps * high[:, None]) % np.uint64(self.bits.size * 8)

    def add(self, values: np.ndarray) -> None:
        probes = self._probes(values).ravel()
        np.bitwise_or.at(self.bits, probes >> np.uint64(3),
                         np.left_shift(1, probes & np.uint64(7)).astype(np.uint8))

    def may_hold(self, values: np.ndarray) -> np.ndarray:
        """A bool per value: False = certainly never added."""
        probes = self._probes(values)
        found = (self.bits[probes >> np.uint64(3)] >> (probes & np.uint64(7)).astype(np.uint8)) & 1
        return found.all(axis=1)

    def union(self, other: Bloom) -> Bloom:
        return Bloom(self.bits | other.bits, self.hashes)
