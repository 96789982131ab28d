"""Batch answers' speed (cli/answers.py): prompts per second answered by 1 and 2 Ray Data actors,
against a plain transformers loop in one process over the same prompts (the model's GPT-2 export,
``generate`` greedy, one prompt at a time), in one run; the answers must agree.

    python benchmarks/batch_generate.py [--prompts 64] [--new-tokens 32]

The model: the baby GPT's shape (6 layers, 384 wide, block 256), random weights, a char tokenizer of
tinyshakespeare; the prompts: its lines. Ray starts once, before the timed runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from raydp_llm.checkpoint.model_dir import save_model_dir
from raydp_llm.cli.answers import answer_table
from raydp_llm.cli.keyvalue import parse_args
from raydp_llm.core.config import ClusterSettings, GenerateSettings, GPTConfig
from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.engines.ray_cluster import ray_session
from raydp_llm.models.factory import build_model
from raydp_llm.models.gpt2 import save_gpt2_dir

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


def transformers_loop(directory: Path, prompts: list[str], new_tokens: int) -> list[str]:
    """The same answers by transformers in this process, a prompt at a time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
            made = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=False)
            out.append(tokenizer.decode(made[0, ids.size(1):]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    text = CORPUS.read_text()
    prompts = [line for line in text.splitlines() if len(line) > 20][:args.prompts]
    tokenizer = CharTokenizer(text)
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=6, n_head=6,
                                  n_embd=384, block_size=256))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model_dir = save_model_dir(d / "model", model, tokenizer)
        pq.write_table(pa.table({"id": list(range(len(prompts))), "prompt": prompts}),
                       d / "prompts.parquet")
        torch.set_num_threads(2)
        clock = time.perf_counter()
        plain = transformers_loop(save_gpt2_dir(d / "hf", model, tokenizer), prompts,
                                  args.new_tokens)
        rows = [("transformers loop, one process", time.perf_counter() - clock)]
        with ray_session(ClusterSettings(), "batch_generate"):
            for actors in (1, 2):
                s = parse_args(GenerateSettings, [
                    f"model_dir={model_dir}", f"data.path={d / 'prompts.parquet'}",
                    f"out={d / f'out{actors}'}", f"max_new_tokens={args.new_tokens}",
                    "temperature=0", "rows_per_part=8", f"actors={actors}"], ("model_dir",))
                clock = time.perf_counter()
                answer_table(s)
                rows.append((f"batch answers, {actors} actor{'s' * (actors > 1)}",
                             time.perf_counter() - clock))
                got = pq.read_table(sorted((d / f"out{actors}").glob("part-*.parquet")))
                agree = sum(a == b for a, b in zip(got.column("completion").to_pylist(), plain))
                print(f"{actors} actor(s): {agree}/{len(prompts)} answers equal the loop's")
    print(f"| {len(prompts)} prompts × {args.new_tokens} new tokens | seconds | prompts/s |")
    print("|---|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.1f} | {len(prompts) / seconds:.2f} |")


if __name__ == "__main__":
    main()
