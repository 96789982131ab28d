"""The targets' scores without the whole logits (issue 69): every objective's loss and
log-probabilities come from each target's cross-entropy, computed here from the hidden states
through the output head a chunk of rows at a time, so that no (B, T, V) tensor is ever made.

At Qwen2.5-0.5B's head (896 → 151,936) a sequence of 1,024 tokens has 0.6 GB of logits in
float32, their gradient as much again; a chunk holds ``LOGIT_ELEMENTS`` of them. The backward pass
makes each chunk's logits again and adds its part of the head's gradient into one buffer (as
Liger's fused linear cross-entropy does, in plain torch): one matmul more than whole logits, and
memory bounded by a chunk. benchmarks/chunked_loss.py measures both.

Shapes: B batch, T time, C width, V vocabulary, M counted targets, R rows of a chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

IGNORE = -100  # a target the loss skips: a chat token outside data.train_on, or padding
LOGIT_ELEMENTS = 2**26  # R × V at most: 256 MiB of float32 logits a chunk


@dataclass
class TokenScores:
    """What a model made of each target (B, T): its cross-entropy in nats (0 where IGNORE), with
    the gradient, and whether the model's most likely token was it."""

    nats: torch.Tensor  # (B, T) float32
    hits: torch.Tensor  # (B, T) bool
    counted: torch.Tensor  # (B, T) bool: the targets not IGNORE

    @property
    def mean(self) -> torch.Tensor:
        """The mean cross-entropy over the counted targets; 0 with a gradient of 0 when there
        are none (not NaN)."""
        return self.nats.sum() / self.counted.sum().clamp(min=1)


@dataclass(frozen=True)
class Head:
    """How a model's logits are made from its hidden states: ``weight`` (V, C), no bias, then
    ``cap · tanh(z / cap)`` when ``cap`` (Gemma's soft cap), times ``scale`` (Cohere's
    logit_scale, 1 / Granite's logits_scaling, 1 / a sampling temperature)."""

    weight: torch.Tensor
    cap: float | None = None
    scale: float = 1.0

    def tempered(self, temperature: float) -> Head:
        return Head(self.weight, self.cap, self.scale / temperature)


def token_scores(head: Head | Callable, x: torch.Tensor, targets: torch.Tensor,
                 temperature: float = 1.0) -> TokenScores:
    """The scores of ``targets`` (B, T) from hidden states ``x`` (B, T, C): of the counted
    targets' rows only, a chunk at a time. ``head`` is a ``Head`` (fused: the head's gradient
    summed chunk by chunk into one buffer), or any module making logits (each chunk
    checkpointed: a LoRA-adapted or biased head)."""
    counted = targets != IGNORE
    where = counted.flatten().nonzero().squeeze(1)  # (M,) the counted targets' places
    rows, wanted = x.flatten(0, 1)[where], targets.flatten()[where]  # (M, C), (M,)
    if isinstance(head, Head):
        nats, hits = _fused(head.tempered(temperature), rows, wanted)
    else:
        nats, hits = _checkpointed(head, rows, wanted, temperature)
    flat = torch.zeros(targets.numel(), dtype=torch.float32, device=x.device)
    flat = flat.index_put((where,), nats)
    if not len(where) and torch.is_grad_enabled() and x.requires_grad:
        # none counted: a gradient of 0 to every weight (the head's too), as every rank gives
        weight = head.weight if isinstance(head, Head) else None
        flat = flat + (head(x[:1, :1]) if weight is None else x[:1, :1] @ weight.T).sum() * 0.0
    found = torch.zeros(targets.numel(), dtype=torch.bool, device=x.device)
    found[where] = hits
    return TokenScores(flat.view_as(targets), found.view_as(targets), counted)


def _chunk_rows(vocab: int) -> int:
    return max(1, LOGIT_ELEMENTS // vocab)


def _fused(head: Head, rows: torch.Tensor, wanted: torch.Tensor):
    dtype = torch.get_autocast_dtype(rows.device.type) \
        if torch.is_autocast_enabled(rows.device.type) else head.weight.dtype
    return _HeadCrossEntropy.apply(rows, head.weight, wanted, head.cap, head.scale, dtype)


def _logits(x: torch.Tensor, weight: torch.Tensor, head: tuple, dtype) -> tuple:
    """A chunk's logits (R, V) in float32, and ``tanh(z / cap)`` (R, V) when capped; ``weight``
    already in the matmul's ``dtype`` (cast once, not a chunk at a time)."""
    cap, scale = head
    raw = (x.to(dtype) @ weight.T).float()
    if cap is None:
        return raw.mul_(scale), None
    capped = raw.div_(cap).tanh_()
    return capped * (cap * scale), capped


class _HeadCrossEntropy(torch.autograd.Function):
    """Each row's cross-entropy (M,) and hit (M,) from hidden rows (M, C) and the head's weight
    (V, C), a chunk of rows at a time, forward and backward (the chunk's logits made again, but
    for a batch of one chunk)."""

    @staticmethod
    def forward(ctx, rows, weight, wanted, cap, scale, dtype):
        lse = torch.empty(rows.size(0), dtype=torch.float32, device=rows.device)
        nats, hits = torch.empty_like(lse), torch.empty_like(lse, dtype=torch.bool)
        size = _chunk_rows(weight.size(0))
        # one chunk in all: its logits kept for the backward (within the bound), not made again
        ctx.kept = None
        cast = weight.to(dtype)
        with torch.autocast(rows.device.type, enabled=False):
            for s in range(0, rows.size(0), size):
                z, capped = _logits(rows[s:s + size], cast, (cap, scale), dtype)
                if rows.size(0) <= size and any(ctx.needs_input_grad[:2]):
                    ctx.kept = (z, capped)
                y = wanted[s:s + size]
                lse[s:s + size] = torch.logsumexp(z, dim=-1)
                nats[s:s + size] = lse[s:s + size] - z.gather(1, y[:, None])[:, 0]
                hits[s:s + size] = z.argmax(dim=-1) == y
        # the log-sum-exp kept (M,): the backward's softmax is then one pass, in place
        ctx.save_for_backward(rows, weight, wanted, lse)
        ctx.head, ctx.dtype = (cap, scale), dtype
        ctx.mark_non_differentiable(hits)
        return nats, hits

    @staticmethod
    def backward(ctx, grad_nats, _):
        rows, weight, wanted, lse = ctx.saved_tensors
        cap, scale = ctx.head
        want_rows, want_weight = ctx.needs_input_grad[:2]
        grad_rows = torch.empty_like(rows) if want_rows else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if want_weight else None
        size = _chunk_rows(weight.size(0))
        cast = weight.to(ctx.dtype)
        with torch.autocast(rows.device.type, enabled=False):
            for s in range(0, rows.size(0), size):
                x, y = rows[s:s + size], wanted[s:s + size]
                g, capped = ctx.kept or _logits(x, cast, ctx.head, ctx.dtype)
                ctx.kept = None
                g.sub_(lse[s:s + size, None]).exp_()  # softmax; d nats / d z = it - one-hot
                g[torch.arange(len(y), device=y.device), y] -= 1
                g.mul_(grad_nats[s:s + size, None] * scale)  # d / d (z / scale)
                if capped is not None:
                    g.mul_(capped.square_().neg_().add_(1))  # through cap · tanh(raw / cap)
                if want_rows:
                    grad_rows[s:s + size] = (g.to(ctx.dtype) @ cast).to(rows.dtype)
                if want_weight:
                    grad_weight.addmm_(g.T, x.float())
        weight_grad = None if grad_weight is None else grad_weight.to(weight.dtype)
        return grad_rows, weight_grad, None, None, None, None


def _chunk_scores(head: Callable, x: torch.Tensor, y: torch.Tensor, temperature: float):
    """The cross-entropy (R,) of targets ``y`` (R,) from hidden rows ``x`` (R, C), and the hits
    (R,)."""
    logits = head(x).float()  # (R, V)
    if temperature != 1:
        logits = logits / temperature
    return F.cross_entropy(logits, y, reduction="none"), logits.argmax(dim=-1) == y


@torch.no_grad()
def _vocab_of(head: Callable, rows: torch.Tensor) -> int:
    """The logits' width of a head that does not say it (one row through it)."""
    return head(rows[:1]).size(-1)


def _checkpointed(head: Callable, rows: torch.Tensor, wanted: torch.Tensor, temperature: float):
    """``_chunk_scores`` a chunk at a time; with gradients and more than one chunk, each chunk
    checkpointed (its logits dropped after its loss, made again in the backward pass)."""
    if not rows.size(0):
        return rows.new_zeros(0, dtype=torch.float32), rows.new_zeros(0, dtype=torch.bool)
    size = _chunk_rows(getattr(head, "out_features", None) or _vocab_of(head, rows))
    recompute = torch.is_grad_enabled() and rows.requires_grad and rows.size(0) > size
    nats, hits = [], []
    for s in range(0, rows.size(0), size):
        part = (head, rows[s:s + size], wanted[s:s + size], temperature)
        done = checkpoint(_chunk_scores, *part, use_reentrant=False) if recompute \
            else _chunk_scores(*part)
        nats.append(done[0])
        hits.append(done[1])
    return torch.cat(nats), torch.cat(hits)
