"""GRPO here against TRL's ``GRPOTrainer`` on the same small transformers model, prompts, reward
and settings, on the same machine, in one run (issue 59): seconds per step, answer tokens per
second (the answers' tokens over the whole step) and the reward after the steps, for each.

    pip install --target /tmp/trl_site --no-deps trl==1.16.0   # TRL for this benchmark only
    python benchmarks/grpo_vs_trl.py --trl-path /tmp/trl_site [--new 16 64] [--steps 20]

The model: a fresh transformers Llama (4 layers × 256, a character tokenizer) saved as a Hugging
Face directory; 800 prompts of five random words; the reward the share of ``e`` in an answer;
8 prompts × 8 answers a step of at most ``--new`` tokens, beta 0, temperature 1, lr 1e-5. Ours:
``python -m raydp_llm.train`` (``train.objective=grpo``, 2 DDP workers of 1 CPU, the command as a
user runs it) and its metrics.csv; TRL: ``GRPOTrainer`` with its defaults on the CPU (gradient
checkpointing on; bf16 off, as ours on a CPU), one process of 2 threads. Both figures are the
mean of the second half of the steps (the first half warms up).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REWARD = ("def share_of_e(prompts, completions, **columns):\n"
          "    return [c.count('e') / max(len(c), 1) for c in completions]\n")
WORDS = "rose thorn flower sweet name guard romeo art thou the seven green deep".split()
PROMPTS, ANSWERS, LR = 8, 8, 1e-5

TRL_SCRIPT = '''
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

model_dir, prompts, new, steps, out = sys.argv[1:6]
torch.set_num_threads(2)
rows = [json.loads(line) for line in open(prompts)]
exec(open(sys.argv[6]).read())  # share_of_e


class Clock(TrainerCallback):
    def __init__(self):
        self.ends = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


clock = Clock()
config = GRPOConfig(output_dir=out, per_device_train_batch_size=64, num_generations=8,
                    max_completion_length=int(new), max_steps=int(steps), learning_rate=1e-5,
                    beta=0.0, temperature=1.0, logging_steps=1, report_to="none",
                    save_strategy="no", use_cpu=True, bf16=False, seed=1)
trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                      processing_class=AutoTokenizer.from_pretrained(model_dir),
                      reward_funcs=share_of_e, args=config,
                      train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]),
                      callbacks=[clock])
trainer.train()
logs = [h for h in trainer.state.log_history if "reward" in h]
half = int(steps) // 2
seconds = (clock.ends[-1] - clock.ends[half - 1]) / (int(steps) - half)
length = sum(h["completions/mean_length"] for h in logs[half:]) / len(logs[half:])
print(json.dumps({"s_per_step": seconds, "answer_tokens": length * 64,
                  "reward": sum(h["reward"] for h in logs[half:]) / len(logs[half:])}))
'''


def make_task(directory: Path) -> dict[str, Path]:
    """The model directory, the prompts (JSON Lines) and the reward file."""
    import torch

    from raydp_llm.checkpoint.model_dir import save_model_dir
    from raydp_llm.core.model_config import LlamaConfig
    from raydp_llm.core.tokenizer import CharTokenizer
    from raydp_llm.models.factory import build_model

    tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,!?\n")
    torch.manual_seed(0)
    model = directory / "llama"
    save_model_dir(model, build_model(LlamaConfig(vocab_size=tokenizer.vocab_size, block_size=256,
                                                  n_layer=4, n_head=4, n_embd=256)), tokenizer)
    rng = random.Random(0)
    prompts = directory / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(rng.choices(WORDS, k=5))}) + "\n"
                               for _ in range(800)))
    reward = directory / "reward.py"
    reward.write_text(REWARD)
    return {"model": model, "prompts": prompts, "reward": reward}


def ours(task: dict[str, Path], new: int, steps: int, out: Path, workers: int = 2) -> dict:
    """``python -m raydp_llm.train`` as a user runs it; the second half's figures."""
    command = [sys.executable, "-m", "raydp_llm.train", "model=hf", f"model.path={task['model']}",
               "data.format=prompts", f"data.path={task['prompts']}", "train.objective=grpo",
               f"grpo.rewards=[{task['reward']}:share_of_e]", f"grpo.num_generations={ANSWERS}",
               f"grpo.max_new_tokens={new}", f"train.batch_size={PROMPTS}",
               f"train.num_workers={workers}", "train.cpus_per_worker=1", f"optim.lr={LR}",
               "optim.warmup_steps=0", f"train.max_steps={steps}",
               f"train.eval_interval={steps // 2}", "train.eval_batches=1",
               f"data.cache_dir={out.parent / 'cache'}", f"hydra.run.dir={out}"]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True)
    from raydp_llm.training.driver.metrics import read_metrics

    last = read_metrics(out / "metrics.csv")[-1]
    return {"s_per_step": last["step_time_s"], "reward": last["reward_mean"],
            "answer_tokens": last["completion_len_mean"] * PROMPTS * ANSWERS}


def trl(task: dict[str, Path], new: int, steps: int, out: Path, trl_path: str) -> dict:
    script = out.parent / "trl_grpo.py"
    script.write_text(TRL_SCRIPT)
    env = os.environ | {"PYTHONPATH": trl_path, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(script), str(task["model"]), str(task["prompts"]),
                           str(new), str(steps), str(out), str(task["reward"])], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"TRL's run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-path", required=True, help="where TRL is installed (--target)")
    parser.add_argument("--new", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(f"{PROMPTS} prompts × {ANSWERS} answers a step, {args.steps} steps, beta 0; Llama 4 × "
          "256, character tokenizer; the second half's means\n")
    print("| answers ≤ | run | s per step | steps/s vs TRL | answer tokens/s | reward |")
    print("|---:|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        task = make_task(Path(tmp))
        for new in args.new:
            found = {"TRL GRPOTrainer (1 process)": trl(task, new, args.steps,
                                                        Path(tmp) / f"trl{new}", args.trl_path),
                     "ours, 2 workers": ours(task, new, args.steps, Path(tmp) / f"ours{new}")}
            base = found["TRL GRPOTrainer (1 process)"]["s_per_step"]
            for name, got in found.items():
                print(f"| {new} | {name} | {got['s_per_step']:.2f} | "
                      f"{base / got['s_per_step']:.2f}× | "
                      f"{got['answer_tokens'] / got['s_per_step']:,.0f} | {got['reward']:.4f} |",
                      flush=True)


if __name__ == "__main__":
    main()
