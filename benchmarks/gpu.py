"""The model's training step alone, on whatever device torch sees: no Ray, no Spark, no Hydra (only
torch and this package's model file, which need nothing else), so it runs on a bare GPU machine.

    python benchmarks/gpu.py                      # every model × precision × compile case
    python benchmarks/gpu.py --models baby --batch 2 --steps 2 --warmup 1 --no-compile  # on a CPU
    python benchmarks/gpu.py --models llama_1b gpt2_small   # transformers' Llama beside the GPT

For each case: forward, backward, fused AdamW (on CUDA) and zero_grad, on random tokens; tokens/s
over ``--steps`` after ``--warmup`` (torch.compile's compilation falls in the warm-up), and MFU:
model FLOPs per token (6N + attention, as nanoGPT counts) × tokens/s ÷ the device's dense bf16
peak.
``llama_1b`` is transformers' LlamaForCausalLM of Llama-3.2-1B's shape (hidden 2048, 16 layers, 32
heads, 8 key/value heads, intermediate 8192, vocabulary 128,256, tied embeddings; SDPA attention),
random weights, as ``model=llama`` builds it; it needs transformers, and is left out with a note
where transformers is not installed (the GPT cases need only torch).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from raydp_llm.core.model_config import GPTConfig
from raydp_llm.models.factory import build_model

# GPT-2 small (nanoGPT's vocabulary padded to 50304) and nanoGPT's shakespeare_char "baby GPT"
MODELS = {
    "gpt2_small": GPTConfig(vocab_size=50304, n_layer=12, n_head=12, n_embd=768, block_size=1024),
    "baby": GPTConfig(vocab_size=65, n_layer=6, n_head=6, n_embd=384, block_size=256),
}
# transformers' Llama (built only when asked for: transformers is imported then)
LLAMAS = {
    "llama_1b": dict(vocab_size=128256, hidden_size=2048, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
                     tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=2048),
}
BLOCK = {**{name: cfg.block_size for name, cfg in MODELS.items()}, "llama_1b": 2048}
VOCAB = {**{name: cfg.vocab_size for name, cfg in MODELS.items()}, "llama_1b": 128256}
BATCH = {"gpt2_small": 16, "baby": 64, "llama_1b": 4}  # micro-batch per step, of BLOCK tokens
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10G": 125.0}


@dataclass
class Case:
    model: str
    bf16: bool
    compiled: bool


def device_peak(device: torch.device, given: float | None) -> float | None:
    """Dense bf16 TFLOP/s of the device: ``--peak-tflops``, else from the GPU's name."""
    if given or device.type != "cuda":
        return given
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


class Llama(torch.nn.Module):
    """transformers' LlamaForCausalLM with the GPT's interface here: ``(None, scores)`` from
    ``(idx, targets)``, its parameter count and FLOPs per token."""

    def __init__(self, name: str):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(**LLAMAS[name], use_cache=False)
        self.net = LlamaForCausalLM._from_config(config, attn_implementation="sdpa",
                                                 dtype=torch.float32)
        self.block = BLOCK[name]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        from raydp_llm.models.base import token_scores

        x = self.net.model(input_ids=idx, use_cache=False).last_hidden_state
        return None, token_scores(self.net.lm_head, x, targets, self.net.config.vocab_size)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # the tied table once

    def flops_per_token(self) -> float:
        """6N + 12·L·H·Q·T, as the GPT counts (PaLM's estimate)."""
        c = self.net.config
        return 6 * self.num_params() + 12 * c.num_hidden_layers * c.hidden_size * self.block


def build(name: str) -> torch.nn.Module:
    return Llama(name) if name in LLAMAS else build_model(MODELS[name])


def run_case(case: Case, device: torch.device, args: argparse.Namespace) -> dict:
    """Tokens/s of ``steps`` training steps after ``warmup`` steps."""
    torch.manual_seed(0)
    model = build(case.model).to(device)
    step_model = torch.compile(model) if case.compiled else model
    fused = device.type == "cuda"  # one kernel for the whole update
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=fused)
    batch, steps, warmup = args.batch or BATCH[case.model], args.steps, args.warmup
    block = args.block or BLOCK[case.model]
    x = torch.randint(0, VOCAB[case.model], (batch, block + 1), device=device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if case.bf16
                else nullcontext())
    for i in range(warmup + steps):
        if i == warmup:
            synchronize(device)
            start = time.perf_counter()
        with autocast:
            _, scores = step_model(x[:, :-1], x[:, 1:])
            loss = scores.mean
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    seconds = time.perf_counter() - start
    tokens_per_s = steps * batch * block / seconds
    return {"tokens_per_s": tokens_per_s, "flops": model.flops_per_token() * tokens_per_s,
            "params": model.num_params(), "batch": batch, "block": block}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    names = [*MODELS, *LLAMAS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=names, choices=names)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, help="micro-batch (default: 16 gpt2_small, 64 baby, "
                                                  "4 llama_1b)")
    parser.add_argument("--block", type=int, help="tokens per sequence (default: the model's "
                                                  "block, 2048 for llama_1b)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile cases")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak")
    args = parser.parse_args()
    models = args.models
    if importlib.util.find_spec("transformers") is None and set(models) & set(LLAMAS):
        print("transformers is not installed: the Llama cases are left out")
        models = [m for m in models if m not in LLAMAS]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 cases use TF32 tensor cores, as usual
    torch.backends.cudnn.allow_tf32 = True
    peak = device_peak(device, args.peak_tflops)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}; bf16 peak: {peak or 'unknown'} TFLOP/s")
    print("| model | params M | batch × block | bf16 | compile | tokens/s | TFLOP/s | MFU |")
    print("|---|---:|---:|---|---|---:|---:|---:|")
    compiles = [False] if args.no_compile else [False, True]
    for model in models:
        precisions = (True,) if model in LLAMAS else (False, True)  # a 1B model: bf16 only
        for bf16 in precisions:
            for compiled in compiles:
                row = run_case(Case(model, bf16, compiled), device, args)
                tflops = row["flops"] / 1e12
                mfu = f"{tflops / peak:.1%}" if peak else "n/a"
                print(f"| {model} | {row['params'] / 1e6:.1f} | {row['batch']} × "
                      f"{row['block']} | {bf16} | {compiled} | "
                      f"{row['tokens_per_s']:,.0f} | {tflops:.1f} | {mfu} |", flush=True)


if __name__ == "__main__":
    main()
