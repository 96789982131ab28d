"""Generation speed: the models' carried state (the GPT's KV cache, the LSTM's (h, c)) against the
window recomputed for every new token (``LanguageModel.next_logits``, what ``generate`` did before),
on CPU, greedy, 500 new tokens after a 20-token prompt. Both must give the same tokens.

    python benchmarks/generate.py [--new-tokens 500] [--threads 2]

A token sees the last block_size tokens with positions counted from the window's start (as in
training), so once the text outgrows the window every position changes and the window is computed
again, with or without a cache: the speed-up applies while prompt + new tokens fit in block_size.
The table shows models whose window holds all 520 tokens and the project's configurations as they
are (block 64-256).
"""

from __future__ import annotations

import argparse
import time
import types
from dataclasses import dataclass

import torch

from raydp_llm.core.model_config import GPTConfig, LSTMConfig, ModelConfig
from raydp_llm.models.base import LanguageModel
from raydp_llm.models.factory import build_model

VOCAB, PROMPT = 65, 20


@dataclass
class Case:
    name: str
    model: ModelConfig


CASES = [
    Case("gpt (default)", GPTConfig(vocab_size=VOCAB)),
    Case("gpt_mini", GPTConfig(vocab_size=VOCAB, n_layer=6, n_head=6, n_embd=192,
                               block_size=128)),
    Case("shakespeare_char", GPTConfig(vocab_size=VOCAB, n_layer=6, n_head=6, n_embd=384,
                                       block_size=256)),
    Case("gpt, block 1024", GPTConfig(vocab_size=VOCAB, block_size=1024)),
    Case("gpt_mini, block 1024", GPTConfig(vocab_size=VOCAB, n_layer=6, n_head=6, n_embd=192,
                                           block_size=1024)),
    Case("baby GPT, block 1024", GPTConfig(vocab_size=VOCAB, n_layer=6, n_head=6, n_embd=384,
                                           block_size=1024)),
    Case("lstm (default)", LSTMConfig(vocab_size=VOCAB)),
    Case("lstm, block 1024", LSTMConfig(vocab_size=VOCAB, block_size=1024)),
]


def timed_generate(model: LanguageModel, prompt: torch.Tensor, new: int) -> tuple[torch.Tensor,
                                                                                   float]:
    start = time.perf_counter()
    out = model.generate(prompt, new, temperature=0)
    return out, time.perf_counter() - start


def measure(case: Case, new: int) -> dict:
    torch.manual_seed(0)
    model = build_model(case.model).eval()
    prompt = torch.randint(0, VOCAB, (1, PROMPT))
    carried, carried_s = timed_generate(model, prompt, new)
    # the baseline: this instance recomputes the window for every token
    model.next_logits = types.MethodType(LanguageModel.next_logits, model)
    recomputed, recomputed_s = timed_generate(model, prompt, new)
    return {
        "model": case.name,
        "block": str(case.model.block_size),
        "params M": f"{model.num_params() / 1e6:.1f}",
        "recompute tok/s": f"{new / recomputed_s:,.0f}",
        "carried tok/s": f"{new / carried_s:,.0f}",
        "speed-up": f"{recomputed_s / carried_s:.1f}×",
        "same tokens": str(torch.equal(carried, recomputed)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.new_tokens} new tokens after {PROMPT}, greedy, {args.threads} torch threads")
    for i, case in enumerate(CASES):
        row = measure(case, args.new_tokens)
        if i == 0:
            print("| " + " | ".join(row) + " |")
            print("|" + "---|" * len(row))
        print("| " + " | ".join(row.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
