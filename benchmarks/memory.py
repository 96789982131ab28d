"""Memory and speed of one model under each training strategy: peak RSS per worker (CPU) and
tokens/s of a 100M-class Llama on 2 workers (gloo), each case in fresh processes.

    python benchmarks/memory.py [--layers 12] [--seq 256] [--steps 3] [--cases ddp fsdp ...]

The model is transformers' Llama built by ``model=llama`` (hidden 768, 12 layers, 12 heads, 4
key/value heads, intermediate 2048, vocabulary 32,000, tied embeddings: 100M parameters), trained
with the project's own pieces: ``parallel.shard`` (FSDP2 per block), ``parallel.checkpoint_
activations``, ``lora.add_adapters`` (rank 16 on every projection) and ``optim.make_optimizer``
(AdamW), on random tokens, a micro-batch of 1 × ``--seq`` per worker.
  ddp        DistributedDataParallel: each worker holds the whole model, its gradients, AdamW's
             two moments (the baseline)
  fsdp       FSDP2 over the 2 workers: each holds half of the parameters, gradients and moments
  fsdp+ac    FSDP2 with activation checkpointing per block
  lora       DDP with rank-16 LoRA adapters: the base frozen, no gradients or moments for it
Each worker reports its RSS after the imports (torch, transformers), its peak RSS while building
the model (every worker builds it whole, then shards it), and its peak RSS over ``--steps`` timed
steps after a warm-up step (``VmHWM``, reset between): the training peak. The table gives the
larger worker's training peak minus the imports, per parameter, beside the bytes per parameter the
strategy holds on paper (fp32 weights 4, gradients 4, AdamW 8; FSDP divides them by the workers;
LoRA keeps 4 for the frozen base), then activations on top; and the tokens/s of both workers
together.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MB = 2**20
WORLD = 2
CASES = ("ddp", "fsdp", "fsdp+ac", "lora")
PAPER = {"ddp": "16", "fsdp": "16 / 2 = 8", "fsdp+ac": "16 / 2 = 8", "lora": "4 + 16 × adapters"}


def llama(layers: int, seq: int, lora: bool):
    """The benchmark's Llama on this worker (seed 0: every worker builds the same), with rank-16
    LoRA adapters and its base frozen when ``lora``; and its parameters before the adapters."""
    import torch

    from raydp_llm.core.config import LlamaConfig
    from raydp_llm.core.model_config import LoraSettings
    from raydp_llm.models.factory import build_model

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, block_size=seq, n_layer=layers, n_embd=768, n_head=12,
                      n_kv_head=4, intermediate_size=2048)
    model = build_model(cfg)
    params = model.num_params()
    if lora:
        from raydp_llm.models.lora import add_adapters

        for p in model.parameters():
            p.requires_grad_(False)
        model.net = add_adapters(model.net, LoraSettings(r=16, alpha=32.0), seed=0)
    return model, params


def build(layers: int, seq: int, case: str):
    """The model of ``case`` on this worker: built, adapted, checkpointed per block, sharded."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from raydp_llm.training.worker import parallel

    model, params = llama(layers, seq, lora=case == "lora")
    if case == "fsdp+ac":
        parallel.checkpoint_activations(model)
    if case.startswith("fsdp"):
        return model, parallel.shard(model, torch.device("cpu"), "fp32"), params
    return model, DistributedDataParallel(model), params


def worker(rank: int, port: int, args, case: str, out: Path) -> None:
    import torch
    import torch.distributed as dist
    import transformers  # noqa: F401 - counted in the imports' RSS

    imports_mb = rss_mb()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    from types import SimpleNamespace

    from raydp_llm.training.worker.optim import make_optimizer

    model, wrapped, params = build(args.layers, args.seq, case)
    settings = SimpleNamespace(optim=SimpleNamespace(weight_decay=0.1, lr=1e-4, beta1=0.9,
                                                     beta2=0.95))
    optimizer = make_optimizer(model, settings)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    x = torch.randint(0, 32000, (1, args.seq))
    times = []
    build_peak_mb = status_mb("VmHWM")
    for i in range(1 + args.steps):
        if i == 1:  # the training peak: the timed steps', after the warm-up built AdamW's state
            reset_peak()
        start = time.perf_counter()
        _, scores = wrapped(x, x)
        loss = scores.mean
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    json_out = {"imports_mb": imports_mb, "build_peak_mb": build_peak_mb,
                "peak_mb": status_mb("VmHWM"), "params": params,
                "trainable": trainable, "step_s": sum(times[1:]) / args.steps}
    (out / f"{case}-{rank}.json").write_text(json.dumps(json_out))
    dist.destroy_process_group()


def rss_mb() -> float:
    return status_mb("VmRSS")


def status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def reset_peak() -> None:
    """VmHWM (the peak RSS) starts again from the current RSS (Linux ≥ 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def run_case(args, case: str, out: Path, work=None, rows: int = 1) -> dict:
    """``case`` on both workers, fresh processes running ``work`` (this module's ``worker``
    unless given): the larger worker's figures, and both workers' tokens/s (``rows`` windows of
    ``--seq`` tokens each per step)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(work or worker, args=(port, args, case, out), nprocs=WORLD)
    ranks = [json.loads((out / f"{case}-{r}.json").read_text()) for r in range(WORLD)]
    worst = max(ranks, key=lambda r: r["peak_mb"] - r["imports_mb"])
    step_s = max(r["step_s"] for r in ranks)
    return {**worst, "tokens_per_s": WORLD * rows * args.seq / step_s}


def table(results: dict, base: str) -> str:
    lines = ["| case | params | trained | training peak RSS − imports, MiB | bytes/param | "
             "on paper | × ddp memory | building peak − imports, MiB | tokens/s | "
             "× ddp speed |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    ref = results[base]
    for case, r in results.items():
        used = r["peak_mb"] - r["imports_mb"]
        ref_used = ref["peak_mb"] - ref["imports_mb"]
        lines.append(f"| {case} | {r['params'] / 1e6:.1f}M | {r['trainable'] / 1e6:.2f}M | "
                     f"{used:,.0f} | {used * MB / r['params']:.1f} | {PAPER[case]} | "
                     f"{used / ref_used:.2f} | {r['build_peak_mb'] - r['imports_mb']:,.0f} | "
                     f"{r['tokens_per_s']:,.0f} | "
                     f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f} |")
    return "\n".join(lines)


def arguments(doc: str, cases: tuple[str, ...]):
    """The command line of a benchmark of cases on 2 workers (this one, preference/pairs.py)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=list(cases), choices=cases)
    return parser.parse_args()


def run_cases(args, work=None, rows: int = 1) -> dict:
    """Each of ``args.cases`` in turn (``run_case``), printed as it ends."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            results[case] = run_case(args, case, Path(tmp), work, rows)
            print(f"{case}: {json.dumps(results[case])}", flush=True)
    return results


def main() -> None:
    args = arguments(__doc__, CASES)
    print(table(run_cases(args), args.cases[0]))


if __name__ == "__main__":
    main()
