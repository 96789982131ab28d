"""Document curation, the pieces that run inside Spark's executors: exact-duplicate keys, MinHash
signatures and their LSH bands (near duplicates), the Gopher quality measures, and the n-grams of
the contamination check. Pure numpy and hashlib: deterministic across processes and machines (no
``hash()``, whose seed differs per process).

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


_BULLETS = ("•", "-", "*", "‣", "◦", "·")
_ELLIPSES = ("...", "…")


def quality(text: str) -> dict[str, float]:
    """The Gopher rules' measures of a document (Rae et al. 2021, appendix A.1.1): words, mean word
    length, symbol-to-word ratio, bullet and ellipsis line shares, share of words with a letter,
    duplicate line and paragraph shares (by count and by characters), the character share of the
    most frequent 2-, 3- and 4-gram, and of duplicated 5- to 10-grams; and the mean line length."""
    words = text.split()
    lines = [line for line in text.split("\n") if line.strip()]
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    n_words, chars = max(len(words), 1), max(sum(len(w) for w in words), 1)
    measures = {
        "words": float(len(words)),
        "mean_word_length": chars / n_words,
        "symbol_word_ratio": (text.count("#") + sum(text.count(e) for e in _ELLIPSES)) / n_words,
        "bullet_lines": _share(lines, lambda line: line.lstrip().startswith(_BULLETS)),
        "ellipsis_lines": _share(lines, lambda line: line.rstrip().endswith(_ELLIPSES)),
        "alpha_words": _share(words, lambda w: any(c.isalpha() for c in w)),
        "non_alpha_words": _share(words, lambda w: not any(c.isalpha() for c in w)),
        "mean_line_length": sum(map(len, lines)) / max(len(lines), 1),
    }
    measures |= _duplicates(lines, "line") | _duplicates(paragraphs, "paragraph")
    lowered = [w.casefold() for w in words]
    for n in (2, 3, 4):
        measures[f"top_{n}gram_chars"] = _top_ngram_share(lowered, n, chars)
    for n in range(5, 11):
        measures[f"dup_{n}gram_chars"] = _duplicate_ngram_share(lowered, n, chars)
    return measures


def _share(items: list, test) -> float:
    return sum(1 for item in items if test(item)) / len(items) if items else 0.0


def _duplicates(pieces: list[str], name: str) -> dict[str, float]:
    """The share of ``pieces`` that repeat an earlier one, by count and by characters."""
    seen, repeated, repeated_chars = set(), 0, 0
    for piece in pieces:
        if piece in seen:
            repeated, repeated_chars = repeated + 1, repeated_chars + len(piece)
        seen.add(piece)
    total_chars = max(sum(map(len, pieces)), 1)
    return {f"dup_{name}s": repeated / max(len(pieces), 1),
            f"dup_{name}_chars": repeated_chars / total_chars}


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def _top_ngram_share(words: list[str], n: int, chars: int) -> float:
    """The characters of the most frequent ``n``-gram's occurrences over all word characters."""
    counts: dict[tuple[str, ...], int] = {}
    for gram in _ngrams(words, n):
        counts[gram] = counts.get(gram, 0) + 1
    if not counts:
        return 0.0
    gram, count = max(counts.items(), key=lambda item: item[1])
    return count * sum(map(len, gram)) / chars if count > 1 else 0.0


def _duplicate_ngram_share(words: list[str], n: int, chars: int) -> float:
    """The characters of words inside an ``n``-gram that occurs more than once, over all word
    characters (each word counted once)."""
    grams = _ngrams(words, n)
    counts: dict[tuple[str, ...], int] = {}
    for gram in grams:
        counts[gram] = counts.get(gram, 0) + 1
    covered = np.zeros(len(words), bool)
    for i, gram in enumerate(grams):
        if counts[gram] > 1:
            covered[i:i + n] = True
    return sum(len(w) for w, c in zip(words, covered) if c) / chars


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
