"""Memory of one worker loading a 0.5B-class checkpoint: ``model=hf``'s loader
(``pretrained.load_net``) against the naive way, each in a fresh process.

    python benchmarks/load_memory.py [--layers 24] [--keep DIR]

The checkpoint has Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 key/value heads,
intermediate 4864, vocabulary 151,936, tied embeddings, 32,768 positions), built with transformers'
``Qwen2Config`` and random weights and written by ``save_pretrained`` as float32 safetensors into a
temporary directory: nothing is downloaded.
  naive      ``AutoModelForCausalLM.from_config`` (a random init), then
             ``safetensors.torch.load_file`` and ``load_state_dict``
  ours       ``raydp_llm.models.hf.load_net`` (``from_pretrained`` in float32: the model
             on the meta device, then the safetensors)
  ours × 2   two such workers at once on the node (the file is mmapped: its page cache is shared)
Each worker reports its RSS after the imports (torch, transformers), its peak RSS (``ru_maxrss``)
once loaded and once every weight has been read (a sum over each parameter, as a first forward pass
reads them), and, while every worker of the case is alive, its RSS split into anonymous and
file-backed pages and its PSS (shared pages divided among the processes that map them).
``from_pretrained`` leaves the float32 weights in a private (copy-on-write) mapping of the
safetensors file: loading reads next to nothing, the first use brings the pages into the page
cache (file-backed, shared by the workers of a node), and a write (an optimizer step) copies a
page into the process. "same weights": every parameter's sum equals the naive load's.
Target (``load_net``'s promise: one copy of the weights, not a random init and then the file): a
worker's peak RSS once every weight is read, minus its imports, ≤ 1.1 × the weights' size.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 2**20
QWEN2_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                 tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6)


def write_checkpoint(directory: Path, layers: int) -> dict:
    """A random Qwen2 of QWEN2_05B's shape (``layers`` blocks) saved as float32 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**{**QWEN2_05B, "num_hidden_layers": layers})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())  # the tied table counted once
    files = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    return {"params": params, "weights_mb": params * 4 / MB, "file_mb": files / MB}


def proc_memory() -> dict:
    """This process' RSS, its anonymous and file-backed parts, and its PSS, in MiB."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
    pss = next(line.split()[1] for line in rollup if line.startswith("Pss:"))
    kib = {key: int(status[key].split()[0]) for key in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
    return {"rss_mb": kib["VmRSS"] / 1024, "anon_mb": kib["RssAnon"] / 1024,
            "file_mb": (kib["RssFile"] + kib["RssShmem"]) / 1024, "pss_mb": int(pss) / 1024}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def load(kind: str, directory: Path):
    """The model loaded the ``kind`` way."""
    if kind == "ours":
        from raydp_llm.models.hf import load_net

        return load_net(directory)
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory),
                                             dtype=torch.float32)
    for path in sorted(directory.glob("*.safetensors")):
        model.load_state_dict(load_file(path), strict=False)
    model.tie_weights()
    return model


def read_all(model) -> list[float]:
    """Every parameter read once (as a first forward pass reads them): their sums, in float64."""
    import torch

    with torch.no_grad():
        return [float(p.sum(dtype=torch.float64)) for p in model.parameters()]


def measure(kind: str, directory: Path) -> None:
    """The worker: imports, load, every weight read once, report; then, when the parent says
    every worker has got that far, the memory split while all are alive."""
    import torch  # noqa: F401
    import transformers  # noqa: F401

    if kind == "ours":
        import raydp_llm.models.hf  # noqa: F401
    imports = proc_memory()["rss_mb"]
    t = time.perf_counter()
    model = load(kind, directory)
    result = {"imports_mb": imports, "load_s": time.perf_counter() - t, "loaded_mb": peak_mb()}
    result["sums"] = read_all(model)
    result["read_mb"] = peak_mb()
    print(json.dumps(result), flush=True)
    sys.stdin.readline()  # every worker of the case has read its weights
    print(json.dumps({**result, **proc_memory()}), flush=True)
    sys.stdin.read()  # alive until every worker of the case has measured


def run_case(kind: str, directory: Path, workers: int) -> list[dict]:
    """``workers`` fresh worker processes loading at once; their reports."""
    procs = [subprocess.Popen([sys.executable, __file__, "--measure", kind, "--dir",
                               str(directory)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT) for _ in range(workers)]
    for proc in procs:
        if not proc.stdout.readline():
            raise RuntimeError(f"{kind} worker failed (exit {proc.wait()})")
    reports = []
    for proc in procs:
        proc.stdin.write("\n")
        proc.stdin.flush()
        reports.append(json.loads(proc.stdout.readline()))
    for proc in procs:
        proc.stdin.close()
        proc.wait()
    return reports


def same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(a, b))


def print_table(info: dict, cases: dict[str, list[dict]]) -> None:
    weights, naive = info["weights_mb"], cases["naive"][0]["sums"]
    print(f"\nparams {info['params'] / 1e6:.1f}M; weights {weights:,.0f} MiB in float32; "
          f"safetensors files {info['file_mb']:,.0f} MiB; per worker, MiB\n")
    print("| loader | worker | imports RSS | peak RSS, loaded | peak RSS, weights read | "
          "(read − imports) ÷ weights | anon | file-backed | PSS | load s | same weights |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, reports in cases.items():
        for i, r in enumerate(reports):
            grown = r["read_mb"] - r["imports_mb"]
            print(f"| {name} | {i + 1} of {len(reports)} | {r['imports_mb']:,.0f} | "
                  f"{r['loaded_mb']:,.0f} | {r['read_mb']:,.0f} | {grown / weights:.2f} | "
                  f"{r['anon_mb']:,.0f} | {r['file_mb']:,.0f} | {r['pss_mb']:,.0f} | "
                  f"{r['load_s']:.1f} | {same(r['sums'], naive)} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=24, help="blocks (24: Qwen2.5-0.5B)")
    parser.add_argument("--keep", type=Path, help="write (or reuse) the checkpoint here")
    parser.add_argument("--no-pair", action="store_true", help="skip the two workers at once")
    parser.add_argument("--measure", choices=["naive", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.dir)
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.keep or Path(tmp)
        info_file = directory / "benchmark_info.json"
        if not info_file.exists():
            info_file.parent.mkdir(parents=True, exist_ok=True)
            info_file.write_text(json.dumps(write_checkpoint(directory, args.layers)))
        info = json.loads(info_file.read_text())
        print(f"  checkpoint: {info['params'] / 1e6:.1f}M params in {directory}", file=sys.stderr,
              flush=True)
        cases = {"naive": run_case("naive", directory, 1), "ours": run_case("ours", directory, 1)}
        if not args.no_pair:
            cases["ours × 2 at once"] = run_case("ours", directory, 2)
    print_table(info, cases)


if __name__ == "__main__":
    main()
