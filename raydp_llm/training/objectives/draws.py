"""The random draws of GRPO's answers, counter-based: the token an answer draws at position ``p`` is
picked by a uniform number that is a hash of (the answer's key, ``p``), computed on the model's
device for a whole batch of answers at once (no per-answer generator, no wait on the host). An
answer's key hashes (seed, step, prompt's number, sample) (``answer_key``), so its draws depend on
nothing else: not on the other answers of its batch (``grpo.generation_batch_size``), not on the
worker that draws it, not on how many workers there are.

The hash is SplitMix64's finalizer (Steele, Lea and Flood 2014) in int64 tensors, whose products
wrap as unsigned 64-bit ones do; tests/unit/test_rollout.py checks it against Python's integers.

Shapes: R answers, V vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment: position p hashes key + (p + 1)·GOLDEN
MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # its finalizer's multipliers
WORD = 1 << 64


def _signed(value: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits."""
    value %= WORD
    return value - WORD if value >= 1 << 63 else value


def _shifted(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The logical right shift of int64 ``x`` (torch's ``>>`` keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer of each int64 of ``x``."""
    x = (x ^ _shifted(x, 30)) * _signed(MIX[0])
    x = (x ^ _shifted(x, 27)) * _signed(MIX[1])
    return x ^ _shifted(x, 31)


def answer_key(seed: int, step: int, prompt: int, sample: int) -> int:
    """The key of one answer's draws (an int64): ``prompt`` is the prompt's number in the data."""
    word = np.random.SeedSequence([seed, step, prompt, sample]).generate_state(1, np.uint64)[0]
    return _signed(int(word))


def uniforms(keys: torch.Tensor, position: int) -> torch.Tensor:
    """The uniform numbers in [0, 1) (R,) float64 of answers ``keys`` (R,) int64 at ``position``."""
    bits = mix(keys + _signed((position + 1) * GOLDEN))
    return _shifted(bits, 11).double() * 2.0 ** -53  # the top 53 bits


def pick(probs: torch.Tensor, u: torch.Tensor, top_p: float) -> torch.Tensor:
    """One token per row of ``probs`` (R, V): the inverse of the row's distribution (its nucleus,
    with ``top_p`` < 1) at its uniform number ``u`` (R,)."""
    if top_p < 1:
        ranked, order = probs.sort(dim=-1, descending=True)
        before = ranked.cumsum(dim=-1) - ranked  # the mass of the likelier tokens
        probs = torch.zeros_like(probs).scatter(-1, order, ranked * (before < top_p))
    cdf = probs.double().cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1)).squeeze(1)
    return tokens.clamp(max=probs.size(-1) - 1)
