"""GRPO's generation: the answers' tokens per second of ``rollout.answers_to`` (all the prompts'
samples at once, ``grpo.generation_batch_size`` sequences a batch, counter-based draws on the
device) against one batched transformers ``generate`` (``do_sample``, ``num_return_sequences``) of
the same answers, and against ``answers_to`` a prompt at a time (issue 52's way), in the same run.
The goal (issue 59): ≥ 1.0× transformers'.

    python benchmarks/grpo.py [--prompts 8] [--samples 8] [--new 64] [--width 256] [--layers 4]
    python benchmarks/grpo.py --step      # generation's share of a GRPO step (the worker's)
    python benchmarks/grpo.py --memory    # peak memory of grpo.beta > 0: LoRA-off vs a copy
    python benchmarks/grpo.py --logps     # peak memory of the answers' log-probabilities
    python benchmarks/grpo.py --vs-trl /tmp/trl_site   # against TRL's GRPOTrainer (grpo_vs_trl.py)

The model: transformers' Llama from ``model=llama``'s settings (``--width``, ``--layers``, a
vocabulary of 2,000), fresh weights; prompts of 32 random ids. Every answer runs its full
``--new`` tokens (no end token), so all make the same number. Each side runs once to warm up,
then ``--repeats`` times; the table gives the best.

``--step`` and ``--memory`` run the worker's own step (training/objectives/grpo.py, one process,
world size 1) on the same Llama saved as a transformers directory with a character tokenizer,
rewarded by the share of ``e`` in an answer: ``--step`` splits each step's seconds into generation
(the answers, their rewards) and training (log-probabilities, backward, optimizer); ``--memory``
runs each variant (LoRA or full tuning; ``grpo.beta`` 0 or 0.1) in a process of its own and reads
its peak resident memory, so the reference's cost is the difference beta 0.1 − beta 0.

``--logps``: the log-probabilities of 8 answers of 256 tokens after a prompt of 256, forward and
backward, with a 32,000-token vocabulary, each way in a process of its own: every position's
logits and a log-softmax sliced to the answer (issue 52's), against ``grpo_loss.answer_logps``
(the answer positions' logits alone, a cross-entropy per token); peak resident memory of each.
"""

from __future__ import annotations

import argparse
import json
import resource
import runpy
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from raydp_llm.core.grpo_config import GrpoSettings
from raydp_llm.core.model_config import LlamaConfig
from raydp_llm.models.factory import build_model
from raydp_llm.training.objectives.rollout import Draw, answers_to

REWARD = (
    "def share_of_e(prompts, completions, **columns):\n"
    "    return [c.count('e') / max(len(c), 1) for c in completions]\n")


def ours(model, prompts: list[torch.Tensor], grpo: GrpoSettings) -> float:
    """All the prompts' answers in one ``answers_to``."""
    began = time.perf_counter()
    answers_to(model, prompts, [Draw(seed=1, step=0, prompt=i) for i in range(len(prompts))],
               grpo, ends=())
    return time.perf_counter() - began


def a_prompt_at_a_time(model, prompts: list[torch.Tensor], grpo: GrpoSettings) -> float:
    """Issue 52's: each prompt's samples a batch of their own."""
    return ours(model, prompts, replace(grpo, generation_batch_size=grpo.num_generations))


@torch.no_grad()
def transformers_generate(model, prompts: list[torch.Tensor], grpo: GrpoSettings) -> float:
    """One batched ``generate`` of every prompt's samples (the prompts are as long)."""
    began = time.perf_counter()
    ids = torch.stack(prompts)
    model.net.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                       top_p=grpo.top_p, temperature=grpo.temperature,
                       num_return_sequences=grpo.num_generations,
                       max_new_tokens=grpo.max_new_tokens, min_new_tokens=grpo.max_new_tokens,
                       pad_token_id=0, eos_token_id=None, use_cache=True)
    return time.perf_counter() - began


def worker(directory: Path, layers: int, width: int, lora: bool, beta: float, samples: int,
           new: int):
    """A GRPO worker on a fresh Llama (saved in ``directory`` once), 8 prompts a step."""
    from raydp_llm.checkpoint.model_dir import save_model_dir
    from raydp_llm.core.config import HFConfig, OptimSettings, TrainSettings
    from raydp_llm.core.model_config import LoraSettings
    from raydp_llm.core.tokenizer import CharTokenizer, load_tokenizer
    from raydp_llm.training.objectives import Placement
    from raydp_llm.training.spec import TrainSpec
    from raydp_llm.training.worker.worker import Worker

    model_dir = directory / "llama"
    if not model_dir.is_dir():
        tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,!?\n")
        torch.manual_seed(0)
        save_model_dir(model_dir, build_model(LlamaConfig(
            vocab_size=tokenizer.vocab_size, block_size=256, n_layer=layers, n_head=4,
            n_embd=width)), tokenizer)
        (directory / "reward.py").write_text(REWARD)
    lora_settings = LoraSettings(r=16, alpha=32.0) if lora else LoraSettings()
    grpo = GrpoSettings(num_generations=samples, max_new_tokens=new, beta=beta,
                        rewards=[f"{directory / 'reward.py'}:share_of_e"])
    train = TrainSettings(batch_size=8, max_steps=100, eval_interval=100, cpus_per_worker=2,
                          objective="grpo", num_workers=1)
    spec = TrainSpec(model=HFConfig(path=str(model_dir), block_size=256, lora=lora_settings),
                     optim=OptimSettings(lr=1e-4, warmup_steps=0), train=train, seed=1,
                     tokenizer_json=load_tokenizer(model_dir).to_json(), token_dtype="int32",
                     chars_per_token=None, sampling={}, steps_per_epoch=100, max_steps=100,
                     fingerprint="b" * 20, grpo=grpo)
    return Worker(spec, {"train": Prompts(800), "val": Prompts(0)},
                  Placement(0, 1, 0, torch.device("cpu")))


class Prompts:
    """``n`` prompts of 32 character ids, as the hand-off gives a split."""

    def __init__(self, n: int):
        import numpy as np
        import pyarrow as pa

        from raydp_llm.data.prompts.dataset import TABLE_SCHEMA

        rng = np.random.default_rng(0)
        self.rows = pa.Table.from_pylist(
            [{"index": i, "ids": rng.integers(1, 27, 32, dtype=np.int32).tobytes(), "text": "",
              "columns": "{}"} for i in range(n)], schema=TABLE_SCHEMA)

    def table(self):
        return self.rows


def step_shares(args) -> None:
    """``--step``: each step's seconds, generation's and training's, over ``--repeats`` steps."""
    with tempfile.TemporaryDirectory() as tmp:
        w = worker(Path(tmp), args.layers, args.width, lora=False, beta=0.0,
                   samples=args.samples, new=args.new)
        try:
            steps = w.data.steps(0, 0)
            w.train_step(next(steps), 1e-4, 0)  # warm-up
            sums = [w.train_step(next(steps), 1e-4, s + 1).sums for s in range(args.repeats)]
        finally:
            w.objective.calls.close()
    gen, train = (sum(s[k] for s in sums) / len(sums) for k in ("gen_s", "train_s"))
    tokens = sum(s["answer_tokens"] for s in sums) / len(sums)
    print(f"a step: 8 prompts × {args.samples} answers of ≤ {args.new} tokens; Llama "
          f"{args.layers} × {args.width}, {torch.get_num_threads()} threads\n")
    print("| phase | s per step | share | answer tokens/s |\n|---|---:|---:|---:|")
    for name, seconds in (("generation (answers, rewards)", gen),
                          ("training (log-probs, backward, AdamW)", train)):
        print(f"| {name} | {seconds:.2f} | {seconds / (gen + train):.0%} | "
              f"{tokens / seconds:,.0f} |")


def one_variant(args) -> None:
    """``--variant lora,beta``: one step of that variant; its peak resident memory (JSON)."""
    lora, beta = args.variant.split(",")
    w = worker(Path(args.dir), args.layers, args.width, lora == "lora", float(beta),
               args.samples, args.new)
    try:
        w.train_step(next(w.data.steps(0, 0)), 1e-4, 0)
    finally:
        w.objective.calls.close()
    print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "reference": type(w.reference).__name__ if w.reference is not None else None,
                      "copy": w.reference is not None and w.reference is not w.model}))


def memory(args) -> None:
    """``--memory``: each variant in a process of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        made = worker(Path(tmp), args.layers, args.width, False, 0.0, args.samples, args.new)
        made.objective.calls.close()
        found = {}
        for variant in ("lora,0", "lora,0.1", "full,0", "full,0.1"):
            out = subprocess.run([sys.executable, __file__, "--variant", variant, "--dir", tmp,
                                  "--layers", str(args.layers), "--width", str(args.width),
                                  "--samples", str(args.samples), "--new", str(args.new)],
                                 capture_output=True, text=True, check=True)
            found[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"Llama {args.layers} × {args.width}, one GRPO step of 8 prompts × {args.samples} "
          f"answers\n")
    print("| tuning | grpo.beta | the reference | peak RSS MB | the reference's cost MB |")
    print("|---|---:|---|---:|---:|")
    for variant, got in found.items():
        tuning, beta = variant.split(",")
        base = found[f"{tuning},0"]["peak_mb"]
        what = "none" if float(beta) == 0 else ("a frozen copy" if got["copy"] else
                                                "the model, adapters off")
        print(f"| {tuning} | {beta} | {what} | {got['peak_mb']:,.0f} | "
              f"{got['peak_mb'] - base:,.0f} |")


def logps_peak(way: str, prompt_len: int = 256, answer_len: int = 256, vocab: int = 32000
               ) -> dict:
    """``--logps``'s child: one way's forward and backward; its peak resident memory."""
    from raydp_llm.training.objectives.grpo_loss import answer_batch, answer_logps

    torch.manual_seed(0)
    model = build_model(LlamaConfig(vocab_size=vocab, block_size=1024, n_layer=2, n_head=4,
                                    n_embd=128))
    prompt = torch.randint(1, vocab, (prompt_len,))
    answers = torch.randint(1, vocab, (8, answer_len))
    began = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if way == "answers":
        batch = answer_batch([prompt], [answers], [torch.ones_like(answers, dtype=torch.bool)],
                             [torch.zeros(len(answers))])
        logps = answer_logps(model, batch, 0.9)
    else:  # issue 52's: every position's logits, a log-softmax, then the answer's slice
        ids = torch.cat([prompt.unsqueeze(0).expand(8, -1), answers], dim=1)
        logits = model(ids[:, :-1])[0][:, prompt_len - 1:].float() / 0.9
        logps = torch.log_softmax(logits, -1).gather(2, answers.unsqueeze(2)).squeeze(2)
    logps.sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"before_mb": began, "peak_mb": peak}


def logps_memory() -> None:
    """``--logps``: each way in a process of its own."""
    found = {}
    for way in ("whole", "answers"):
        out = subprocess.run([sys.executable, __file__, "--logps-way", way], capture_output=True,
                             text=True, check=True)
        found[way] = json.loads(out.stdout.strip().splitlines()[-1])
    print("8 answers of 256 tokens after a prompt of 256; Llama 2 × 128, vocabulary 32,000; "
          "forward and backward\n")
    print("| log-probabilities | peak RSS MB | over the model's MB |\n|---|---:|---:|")
    for way, name in (("whole", "every position's logits, log-softmax, sliced (issue 52)"),
                      ("answers", "answer positions alone, cross-entropy per token")):
        got = found[way]
        print(f"| {name} | {got['peak_mb']:,.0f} | {got['peak_mb'] - got['before_mb']:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step", action="store_true", help="generation's share of a step")
    parser.add_argument("--memory", action="store_true", help="the reference's peak memory")
    parser.add_argument("--logps", action="store_true", help="the log-probabilities' memory")
    parser.add_argument("--vs-trl", metavar="TRL_PATH",
                        help="against TRL's GRPOTrainer installed there (grpo_vs_trl.py)")
    parser.add_argument("--logps-way", help=argparse.SUPPRESS)  # --logps's child process
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # --memory's child process
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vs_trl:
        sys.argv = [str(Path(__file__).with_name("grpo_vs_trl.py")), "--trl-path", args.vs_trl]
        return runpy.run_path(sys.argv[0], run_name="__main__")
    if args.logps_way:
        return print(json.dumps(logps_peak(args.logps_way)))
    if args.logps:
        return logps_memory()
    if args.variant:
        return one_variant(args)
    if args.step:
        return step_shares(args)
    if args.memory:
        return memory(args)
    torch.manual_seed(0)
    model = build_model(LlamaConfig(vocab_size=2000, block_size=256, n_layer=args.layers,
                                    n_head=4, n_embd=args.width)).eval()
    grpo = GrpoSettings(num_generations=args.samples, max_new_tokens=args.new, top_p=0.95)
    prompts = [torch.randint(1, 2000, (32,)) for _ in range(args.prompts)]
    tokens = args.prompts * args.samples * args.new
    sides = {"answers_to, every prompt at once": ours,
             "answers_to, a prompt at a time": a_prompt_at_a_time,
             "transformers generate, batched": transformers_generate}
    best = {}
    for name, run in sides.items():
        run(model, prompts[:1], grpo)  # warm-up
        best[name] = min(run(model, prompts, grpo) for _ in range(args.repeats))
    base = best["transformers generate, batched"]
    print(f"{args.prompts} prompts × {args.samples} samples × {args.new} tokens; Llama "
          f"{args.layers} × {args.width}, {torch.get_num_threads()} threads\n")
    print("| generation | s | tokens/s | vs transformers |")
    print("|---|---:|---:|---:|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.2f} | {tokens / seconds:,.0f} | {base / seconds:.2f}× |")


if __name__ == "__main__":
    main()
