"""The loss's memory and time at a real model's head (issue 69): the targets' cross-entropy and its
backward from hidden states through Qwen2.5-0.5B's head shape (hidden 896, a vocabulary of
151,936: the tied embedding's 136M parameters), whole (B, T, V) logits as the models made them
before (``whole``) against ``models/base.token_scores`` in chunks of ``LOGIT_ELEMENTS``
(``chunked``), each in a fresh process, in turn ``--repeats`` times.

    python benchmarks/chunked_loss.py [--batch 2] [--seq 1024] [--vocab 151936] [--width 896]

A process builds the head and the hidden states, notes its RSS, then runs the loss forward and
backward ``--steps`` times; the table gives its peak RSS above that (``VmHWM``: the loss's own
memory, the head's gradient included) and the best seconds a step. The loss's floor is the head's
gradient (V × C × 4 bytes) and the hidden states' (B × T × C × 4); the whole logits alone are
B × T × V × 4 bytes, and their gradient as much again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 2**20


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the RSS now


def one(way: str, batch: int, seq: int, vocab: int, width: int, steps: int) -> dict:
    """In this process: ``way``'s loss forward and backward, its peak above the set-up and the
    best seconds a step."""
    import torch
    from torch.nn import functional as F

    sys.path.insert(0, str(ROOT))
    from raydp_llm.models.scores import Head, token_scores

    torch.manual_seed(0)
    head = torch.nn.Linear(width, vocab, bias=False)
    x = torch.randn(batch, seq, width, requires_grad=True)
    targets = torch.randint(0, vocab, (batch, seq))
    _reset_hwm()
    before = _hwm_mb()
    best = float("inf")
    for _ in range(steps):
        head.zero_grad(set_to_none=True)
        x.grad = None
        start = time.perf_counter()
        if way == "whole":
            logits = head(x)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        else:
            loss = token_scores(Head(head.weight), x, targets).mean
        loss.backward()
        best = min(best, time.perf_counter() - start)
        del loss
    return {"way": way, "peak_mb": _hwm_mb() - before, "step_s": best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--width", type=int, default=896)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = (args.batch, args.seq, args.vocab, args.width, args.steps)
    if args.one:
        print(json.dumps(one(args.one, *shape)))
        return
    results: dict[str, list[dict]] = {"whole": [], "chunked": []}
    for _ in range(args.repeats):
        for way in results:
            done = subprocess.run([sys.executable, __file__, "--one", way,
                                   *(f"--{k}={v}" for k, v in vars(args).items()
                                     if k not in ("one", "repeats"))],
                                  capture_output=True, text=True, check=True)
            results[way].append(json.loads(done.stdout.splitlines()[-1]))
    b, t, v, c = args.batch, args.seq, args.vocab, args.width
    floor = (v * c + b * t * c) * 4 / MB
    print(f"B {b}, T {t}, V {v:,}, C {c}: whole logits {b * t * v * 4 / MB:,.0f} MiB, "
          f"the loss's floor (the head's and the hidden states' gradients) {floor:,.0f} MiB")
    print("| loss | peak above the set-up, MiB | × floor | s a step (best) |")
    print("|---|---:|---:|---:|")
    for way, runs in results.items():
        peak = min(r["peak_mb"] for r in runs)
        step = min(r["step_s"] for r in runs)
        print(f"| {way} | {peak:,.0f} | {peak / floor:.2f} | {step:.2f} |")


if __name__ == "__main__":
    main()
