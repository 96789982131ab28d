"""DPO's reference, in memory and speed: tokens/s and peak RSS per worker of one preference step on
2 workers (gloo), with each reference the service builds, beside a language-model step of the
same tokens (the baseline), each case in fresh processes.

    python benchmarks/preference.py [--layers 12] [--seq 256] [--steps 3] [--cases lm copy ...]

The model is memory.py's 100M-class Llama (``model=llama``), a micro-batch of one pair per worker:
its chosen and its rejected answer, two rows of ``--seq`` tokens whose second half is the answer
(random tokens). Each case trains with the project's own pieces (objectives/dpo.py's loss,
``frozen_copy``, ``reference_of``, ``parallel.shard``, ``lora.add_adapters``, AdamW):
  lm         DDP, next-token cross-entropy on the two rows (the baseline: no reference)
  copy       DDP, the reference a frozen copy of the starting weights (a second model per worker)
  fsdp-copy  FSDP2 over the 2 workers, the frozen copy sharded like the policy
  lora       DDP with rank-16 LoRA adapters; the reference is the base with its adapters off
             (no second copy)
  precomputed  DDP, the reference's log-probabilities of the pair computed before the first
             step (``precomputed.PrecomputedReference``): no reference model at all
The table: the larger worker's training peak RSS minus its imports (the timed steps', after a
warm-up step), and both workers' tokens/s (a pair counts its two rows), each against lm's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import memory  # noqa: E402 - the model and the RSS probes are memory.py's

CASES = ("lm", "copy", "fsdp-copy", "lora", "precomputed")
WORLD = memory.WORLD


def objective(case: str, model, batch):
    """The case's DPO loss (``Dpo`` against its reference, or None for lm), and the model
    the optimizer steps (wrapped for DDP or sharded). ``batch``: the pair it trains on (the
    precomputed reference's log-probabilities are of it)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from raydp_llm.training.objectives.dpo import logps_of, reference_of
    from raydp_llm.training.objectives.reference import frozen_copy
    from raydp_llm.training.worker import parallel

    if case == "lm":
        return None, DistributedDataParallel(model)
    if case == "lora":
        return Dpo(reference_of(model, model)), DistributedDataParallel(model)
    if case == "precomputed":
        from raydp_llm.training.objectives.precomputed import PrecomputedReference

        table = PrecomputedReference("benchmark")
        with torch.no_grad():
            table.fill([batch], lambda b: logps_of(model, b))  # before the first step
        return Dpo(table), DistributedDataParallel(model)
    copy_ = frozen_copy(model)
    if case == "fsdp-copy":
        cpu = torch.device("cpu")
        copy_ = parallel.shard(copy_, cpu, "fp32")
        return Dpo(reference_of(model, copy_)), parallel.shard(model, cpu, "fp32")
    return Dpo(reference_of(model, copy_)), DistributedDataParallel(model)


class Dpo:
    """The DPO loss of a batch of pairs against ``reference`` (a function of the batch), as
    objectives/dpo.py's ``Preference.score`` makes it, without a worker around it."""

    def __init__(self, reference):
        self.reference = reference

    def loss(self, forward, batch):
        import torch

        from raydp_llm.training.objectives.dpo import logps_of
        from raydp_llm.training.objectives.dpo_loss import dpo_loss

        policy = logps_of(forward, batch)
        with torch.no_grad():
            reference = self.reference(batch)
        return dpo_loss(policy, reference, beta=0.1).loss


def pair_batch(seq: int):
    """One pair as the worker's batches hold it: the chosen row, then the rejected; the loss
    counts the second half of each (the answer)."""
    import torch

    from raydp_llm.models.base import IGNORE

    inputs = torch.randint(0, 32000, (2, seq))
    targets = torch.roll(inputs, -1, dims=1)
    targets[:, : seq // 2] = IGNORE
    return SimpleNamespace(inputs=inputs, targets=targets, positions=None,
                           model_args=lambda: {"positions": None})


def step(case: str, scorer, wrapped, batch) -> None:
    if scorer is None:
        _, scores = wrapped(batch.inputs, batch.targets)
        loss = scores.mean
    else:
        loss = scorer.loss(wrapped, batch)
    loss.backward()


def worker(rank: int, port: int, args, case: str, out: Path) -> None:
    import torch
    import torch.distributed as dist
    import transformers  # noqa: F401 - counted in the imports' RSS

    imports_mb = memory.rss_mb()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    from raydp_llm.training.objectives.reference import without_dropout
    from raydp_llm.training.worker.optim import make_optimizer

    model, params = memory.llama(args.layers, args.seq, lora=case == "lora")
    batch, times = pair_batch(args.seq), []
    scorer, wrapped = objective(case, without_dropout(model), batch)
    settings = SimpleNamespace(optim=SimpleNamespace(weight_decay=0.1, lr=1e-4, beta1=0.9,
                                                     beta2=0.95))
    optimizer = make_optimizer(model, settings)
    for i in range(1 + args.steps):
        if i == 1:  # the training peak: the timed steps', after the warm-up built AdamW's state
            memory.reset_peak()
        start = time.perf_counter()
        step(case, scorer, wrapped, batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    (out / f"{case}-{rank}.json").write_text(json.dumps(
        {"imports_mb": imports_mb, "peak_mb": memory.status_mb("VmHWM"), "params": params,
         "step_s": sum(times[1:]) / args.steps}))
    dist.destroy_process_group()


def table(results: dict) -> str:
    lines = ["| case | reference | training peak RSS − imports, MiB | × lm memory | tokens/s | "
             "× lm speed |", "|---|---|---:|---:|---:|---:|"]
    what = {"lm": "none (next-token loss)", "copy": "a frozen copy per worker",
            "fsdp-copy": "a frozen copy, sharded", "lora": "the base, adapters off",
            "precomputed": "log-probabilities computed before training"}
    base = results["lm"]
    base_used = base["peak_mb"] - base["imports_mb"]
    for case, r in results.items():
        used = r["peak_mb"] - r["imports_mb"]
        lines.append(f"| {case} | {what[case]} | {used:,.0f} | {used / base_used:.2f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    args = memory.arguments(__doc__, CASES)
    if "lm" not in args.cases:
        args.cases.insert(0, "lm")  # the baseline, measured in the same run
    print(table(memory.run_cases(args, worker, rows=2)))  # a pair is two rows


if __name__ == "__main__":
    main()
