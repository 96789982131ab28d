"""The sharded paths on a GPU: FSDP2 through nccl on one device, with only torch, transformers and
this package's model files (no Ray, no Spark, no Hydra), so it runs on a bare GPU machine. CI and
the development machine check the same code on gloo and CPU; this is what only a GPU can show.

    python benchmarks/gpu_fsdp.py                          # a Llama of Llama-3.2-1B's shape
    python benchmarks/gpu_fsdp.py --hidden 256 --layers 2  # small, on a CPU (gloo)

1. The shard-by-shard load (``training/sharded_start.fill``) from bf16 safetensors into the
   device's shards equals ``from_pretrained``'s fp32 weights bit for bit (read through a host
   buffer: numpy reads only into host memory); its time and peak device memory beside the whole
   load's (``from_pretrained``, then ``.to(device)``).
2. A training step of that model sharded by ``parallel.shard`` (bf16 parameters, fp32 reduction)
   against the same step of the plain model under bf16 autocast: both losses, tokens/s of each.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from raydp_llm.core.model_config import HFConfig
from raydp_llm.models.hf import HFModel, empty_net
from raydp_llm.training.worker import parallel
from raydp_llm.training.worker.sharded_start import fill


def saved_llama(directory: Path, args: argparse.Namespace) -> None:
    """A random Llama of the asked shape, saved in bf16 (as published checkpoints are)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=max(1, args.hidden // 256),
                         intermediate_size=4 * args.hidden, tie_word_embeddings=True,
                         max_position_embeddings=args.block)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)


def whole_load(directory: Path, device: torch.device) -> HFModel:
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                               attn_implementation="sdpa")
    return HFModel(net.to(device), HFConfig(path=str(directory)))


def sharded_load(directory: Path, device: torch.device, precision: str) -> HFModel:
    """``sharded_start.sharded_model``'s steps without the run's spec."""
    model = HFModel(empty_net(directory), HFConfig(path=str(directory)))
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    parallel.shard(model, device, precision)
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    fill(model, directory)
    return model


def timed(device: torch.device, load):
    """``load()``'s result, its seconds and the device memory it took at its peak, GiB (beyond
    what was allocated before: the other model)."""
    before = 0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    model = load()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = float("nan")
    if device.type == "cuda":
        peak = (torch.cuda.max_memory_allocated() - before) / 2**30
    return model, seconds, peak


def steps(model: HFModel, x: torch.Tensor, autocast: bool, n: int) -> tuple[float, float]:
    """The first step's loss and tokens/s over ``n`` steps after two warm-ups (AdamW)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for i in range(n + 2):
        if i == 2:
            synchronize(x.device)
            start = time.perf_counter()
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            _, scores = model(x[:, :-1], x[:, 1:])
            loss = scores.mean
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    synchronize(x.device)
    return losses[0].item(), n * x[:, 1:].numel() / (time.perf_counter() - start)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--block", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"device: {name}; torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        saved_llama(directory, args)
        whole, whole_s, whole_peak = timed(device, lambda: whole_load(directory, device))
        sharded, sharded_s, sharded_peak = timed(device, lambda: sharded_load(directory, device,
                                                                              "bf16"))
    expected = dict(whole.net.named_parameters())
    unequal = [n for n, p in sharded.net.named_parameters()
               if not torch.equal(parallel.local(p), expected[n])]
    size = sum(p.numel() for p in expected.values()) * 4 / 2**30
    print(f"model: {size:.2f} GiB in fp32; parameters unequal to from_pretrained's: "
          f"{len(unequal)} {unequal[:3]}")
    print("| load | seconds | peak device GiB while loading |\n|---|---:|---:|")
    print(f"| whole (from_pretrained, .to) | {whole_s:.1f} | {whole_peak:.2f} |")
    print(f"| shard by shard | {sharded_s:.1f} | {sharded_peak:.2f} |")
    x = torch.randint(0, args.vocab, (args.batch, args.block + 1), device=device)
    plain_loss, plain_rate = steps(whole, x, autocast=True, n=args.steps)
    fsdp_loss, fsdp_rate = steps(sharded, x, autocast=False, n=args.steps)
    print("| step | first loss | tokens/s |\n|---|---:|---:|")
    print(f"| plain, bf16 autocast | {plain_loss:.4f} | {plain_rate:,.0f} |")
    print(f"| FSDP2, bf16 parameters | {fsdp_loss:.4f} | {fsdp_rate:,.0f} |")
    dist.destroy_process_group()
    if unequal or abs(plain_loss - fsdp_loss) > 0.05:
        raise SystemExit("FAILED: the sharded load or the FSDP2 step differs from the plain model")


if __name__ == "__main__":
    main()
