"""GRPO's generation: the answers' tokens per second of ``rollout.answer`` (a prompt's samples as
one batch with the model's cache, each from its own random stream) against a plain transformers
``generate`` (``do_sample``, ``num_return_sequences``) on the same model and prompts, in the same
run. The goal (issue 52): ≥ 0.9× transformers'.

    python benchmarks/grpo.py [--prompts 8] [--samples 8] [--new 64] [--width 256] [--layers 4]

The model: transformers' Llama from ``model=llama``'s settings (``--width``, ``--layers``, a
vocabulary of 2,000), fresh weights; prompts of 32 random ids. Every answer runs its full
``--new`` tokens (no end token), so both make the same number. Each side runs once to warm up,
then ``--repeats`` times; the table gives the best.
"""

from __future__ import annotations

import argparse
import time

import torch

from raydp_llm.core.grpo_config import GrpoSettings
from raydp_llm.core.model_config import LlamaConfig
from raydp_llm.models.factory import build_model
from raydp_llm.training.rollout import Draw, answer


def ours(model, prompts: list[torch.Tensor], grpo: GrpoSettings) -> float:
    began = time.perf_counter()
    for i, prompt in enumerate(prompts):
        answer(model, prompt, Draw(seed=1, step=0, prompt=i), grpo, end_id=None)
    return time.perf_counter() - began


@torch.no_grad()
def transformers_generate(model, prompts: list[torch.Tensor], grpo: GrpoSettings) -> float:
    began = time.perf_counter()
    for prompt in prompts:
        model.net.generate(input_ids=prompt.unsqueeze(0), attention_mask=torch.ones(1, len(prompt),
                           dtype=torch.long), do_sample=True, top_p=grpo.top_p,
                           temperature=grpo.temperature, num_return_sequences=grpo.num_generations,
                           max_new_tokens=grpo.max_new_tokens, min_new_tokens=grpo.max_new_tokens,
                           pad_token_id=0, eos_token_id=None, use_cache=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(LlamaConfig(vocab_size=2000, block_size=256, n_layer=args.layers,
                                    n_head=4, n_embd=args.width)).eval()
    grpo = GrpoSettings(num_generations=args.samples, max_new_tokens=args.new, top_p=0.95)
    prompts = [torch.randint(1, 2000, (32,)) for _ in range(args.prompts)]
    tokens = args.prompts * args.samples * args.new
    sides = {"rollout.answer": ours, "transformers generate": transformers_generate}
    best = {}
    for name, run in sides.items():
        run(model, prompts[:1], grpo)  # warm-up
        best[name] = min(run(model, prompts, grpo) for _ in range(args.repeats))
    base = best["transformers generate"]
    print(f"{args.prompts} prompts × {args.samples} samples × {args.new} tokens; Llama "
          f"{args.layers} × {args.width}, {torch.get_num_threads()} threads\n")
    print("| generation | s | tokens/s | vs transformers |")
    print("|---|---:|---:|---:|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.2f} | {tokens / seconds:,.0f} | {base / seconds:.2f}× |")


if __name__ == "__main__":
    main()
