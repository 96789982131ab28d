"""The quality filters' measures of a document (the Gopher rules), computed per document inside
Spark's executors (curate.py). Pure Python and numpy: the same values in every process."""

from __future__ import annotations

import numpy as np

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
