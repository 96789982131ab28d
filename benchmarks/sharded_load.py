"""Memory of loading and exporting a transformers checkpoint under FSDP on 2 workers (gloo): the
shard-by-shard load (``training/worker/sharded_start.py``) against the whole load, and the
tensor-by-tensor export (``checkpoint/sharded._streamed``) against the whole export, each in fresh
processes.

    python benchmarks/sharded_load.py [--layers 12] [--dtype float32 bfloat16]

The checkpoint is ``benchmarks/memory.py``'s 100M Llama (hidden 768, 12 layers, vocabulary 32,000,
tied embeddings) with random weights, written by ``save_pretrained`` into a temporary directory in
each ``--dtype`` (the training dtype is float32 either way).
  whole      every worker: ``from_pretrained`` in float32 (``hf.load_net``, as every worker did
             before), then ``parallel.shard``, then every shard read once (a first step reads them)
  sharded    every worker: ``sharded_start.sharded_model`` (the model on the meta device,
             sharded, then each worker's rows read from the files)
Then both workers write a sharded checkpoint (DCP) of the loaded model, and one process exports it
to a Hugging Face directory:
  whole export     the model built whole, the checkpoint loaded into it, ``save_pretrained`` (the
                   export before)
  streamed export  ``checkpoint.sharded.export``: one tensor at a time
And, in fresh workers after a sharded load, the live shards gathered into a model directory on
rank 0 (what ``train.eval_tasks`` scores under FSDP), two ways:
  gather, built whole  the model built from the checkpoint (``build_model``), the gathered state
                       copied into it (``sharded.gathered`` before)
  gather, on meta      ``sharded.gathered``: the model on the meta device takes the gathered
                       tensors
Each figure is a process's peak RSS (``VmHWM``) minus its RSS after the imports (for the gathers:
rank 0's, minus its RSS before the gather, the peak reset there), as a multiple of the model's
float32 size (4 bytes a parameter); the larger worker's for the loads. Target: the sharded load
≤ 0.65× per worker with 2 workers (the whole load ≥ 1×).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from memory import MB, WORLD, rss_mb, status_mb  # noqa: E402 - the same measurements

LOADS = ("whole", "sharded")
EXPORTS = ("whole export", "streamed export")
GATHERS = ("gather, built whole", "gather, on meta")


def write_checkpoint(directory: Path, layers: int, dtype: str) -> int:
    """memory.py's Llama with random weights, saved in ``dtype``; its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=768, num_hidden_layers=layers,
                         num_attention_heads=12, num_key_value_heads=4, intermediate_size=2048,
                         max_position_embeddings=256, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(directory)
    from raydp_llm.core.tokenizer import CharTokenizer

    (directory / "chars.json").write_text(CharTokenizer("abcdefgh").to_json())
    return sum(p.numel() for p in model.parameters())


def spec_of(directory: Path):
    """What ``sharded_model`` and the checkpoint read of a run's spec."""
    from raydp_llm.core.model_config import HFConfig
    from raydp_llm.core.storage import S3Options
    from raydp_llm.core.tokenizer import tokenizer_from_json

    tokenizer = tokenizer_from_json((directory / "chars.json").read_text())
    return SimpleNamespace(
        model=HFConfig(path=str(directory), block_size=256, vocab_size=32000), s3=S3Options(),
        seed=0, pairs=False, tokenizer=lambda: tokenizer,
        train=SimpleNamespace(strategy="fsdp", precision="fp32", activation_checkpointing=False))


def load(case: str, spec):
    """The model as ``case`` loads it on this worker, every shard read once."""
    import torch

    from raydp_llm.models.hf import HFModel, load_net
    from raydp_llm.training.worker import parallel, sharded_start

    if case == "sharded":
        model = sharded_start.sharded_model(spec, torch.device("cpu"))
    else:
        model = HFModel(load_net(Path(spec.model.path)), spec.model)
        parallel.shard(model, torch.device("cpu"), "fp32")
    with torch.no_grad():
        for p in model.parameters():
            parallel.local(p).sum()
    return model


def imported() -> float:
    """The RSS once everything a load or export imports is imported (torch's FSDP, DTensor and
    DCP, transformers' Llama, which a first tiny model builds): what is left is the model's."""
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    from transformers import AutoModelForCausalLM, LlamaConfig

    import raydp_llm.checkpoint.sharded  # noqa: F401
    import raydp_llm.training.worker.sharded_start  # noqa: F401

    tiny = LlamaConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                       intermediate_size=8)
    AutoModelForCausalLM.from_config(tiny)  # transformers imports the family's modules
    return rss_mb()


def worker(rank: int, port: int, case: str, directory: Path, out: Path) -> None:
    import os

    import torch
    import torch.distributed as dist

    from raydp_llm.checkpoint import sharded
    from raydp_llm.checkpoint.layout import TrainState

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    imports_mb = imported()
    spec = spec_of(directory)
    model = load("sharded" if case in GATHERS else case, spec)
    figure = {"load_mb": status_mb("VmHWM") - imports_mb}
    if case == "sharded":  # the checkpoint the exports read (the same tensors either way)
        optimizer = torch.optim.AdamW(model.parameters())
        sharded.save(out / "checkpoint", model, spec.tokenizer(), optimizer, TrainState())
    if case in GATHERS:
        figure = {"gather_mb": gather(case, model, spec, out / case.replace(", ", "_"))}
    (out / f"{case}-{rank}.json").write_text(json.dumps(figure))
    dist.destroy_process_group()


def gather(case: str, model, spec, target: Path) -> float:
    """The live shards gathered into a model directory on rank 0, ``case``'s way: the rise of this
    worker's peak RSS over its RSS before (the peak reset there)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint.state_dict as sd

    from raydp_llm.checkpoint import sharded
    from raydp_llm.models.factory import build_model

    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = rss_mb()
    if case == "gather, on meta":
        sharded.gathered(model, target, spec.model, spec.tokenizer())
    else:  # sharded.gathered before: the model built from the checkpoint, then overwritten
        options = sd.StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = sd.get_model_state_dict(model, options=options)
        if dist.get_rank() == 0:
            whole = build_model(spec.model)
            whole.load_state_dict(state)
            whole.net.save_pretrained(target)
    return status_mb("VmHWM") - before


def export(case: str, directory: Path, out: Path) -> None:
    """One process's export of the checkpoint: ``case``'s way."""
    from raydp_llm.checkpoint import sharded

    imports_mb = imported()
    spec = spec_of(directory)
    target = out / case.replace(" ", "_")
    if case == "streamed export":
        sharded.export(out / "checkpoint", target, spec.model, spec.tokenizer())
    else:  # the export before: the whole model built, the checkpoint loaded into it, saved
        import torch.distributed.checkpoint as dcp
        import torch.distributed.checkpoint.state_dict as sd

        from raydp_llm.checkpoint.layout import SHARDS
        from raydp_llm.models.factory import build_model

        model = build_model(spec.model)
        state = {"model": sd.get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=out / "checkpoint" / SHARDS, no_dist=True)
        sd.set_model_state_dict(model, state["model"])
        model.net.save_pretrained(target)
    (out / f"{case}.json").write_text(json.dumps({"export_mb": status_mb("VmHWM") - imports_mb}))


def measure(directory: Path, out: Path) -> dict:
    """Both loads on 2 workers, then both exports, each in fresh processes."""
    import torch.multiprocessing as mp

    figures = {}
    for case in LOADS:
        spawned(worker, case, directory, out)
        figures[case] = max(json.loads((out / f"{case}-{r}.json").read_text())["load_mb"]
                            for r in range(WORLD))
    for case in GATHERS:  # rank 0 holds the gathered model
        spawned(worker, case, directory, out)
        figures[case] = json.loads((out / f"{case}-0.json").read_text())["gather_mb"]
    context = mp.get_context("spawn")
    for case in EXPORTS:
        proc = context.Process(target=export, args=(case, directory, out))
        proc.start()
        proc.join()
        figures[case] = json.loads((out / f"{case}.json").read_text())["export_mb"]
    return figures


def spawned(work, case: str, directory: Path, out: Path) -> None:
    """``work`` on 2 fresh gloo workers."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(work, args=(port, case, directory, out), nprocs=WORLD)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args()
    cases = LOADS + EXPORTS + GATHERS
    rows = ["| checkpoint dtype | model fp32 MiB | " + " | ".join(cases) + " |",
            "|---|---:|" + "---:|" * len(cases)]
    for dtype in args.dtype:
        with tempfile.TemporaryDirectory() as tmp:
            directory, out = Path(tmp) / "model", Path(tmp) / "out"
            out.mkdir()
            params = write_checkpoint(directory, args.layers, dtype)
            figures = measure(directory, out)
        size = params * 4 / MB
        print(f"{dtype}: {params:,} parameters, {json.dumps(figures)}", flush=True)
        cells = " | ".join(f"{figures[c]:,.0f} MiB ({figures[c] / size:.2f}×)" for c in cases)
        rows.append(f"| {dtype} | {size:,.0f} | {cells} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
