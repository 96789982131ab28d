"""What ``train.eval_tasks`` costs (training/tasks.py): one scoring of a local multiple-choice task
through lm-evaluation-harness on a checkpoint-sized model (its GPT-2 export and the harness's run),
against a training step of the same model, in one run.

    python benchmarks/tasks.py [--documents 100] [--choices 4]

The model: ``+experiment=shakespeare_char``'s (4 layers, 128 wide, block 64; batch 12), random
weights, a char tokenizer of tinyshakespeare; the task: a line of the play, which of ``--choices``
lines follows it (JSON Lines, a task YAML).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from raydp_llm.checkpoint.model_dir import save_model_dir
from raydp_llm.core.config import GPTConfig
from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.models.factory import build_model
from raydp_llm.training.tasks import HarnessSettings, run_tasks

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
TASK = """task: next_line
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{line}}}}\\n"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def write_task(d: Path, lines: list[str], documents: int, choices: int) -> Path:
    rows = []
    for i in range(documents):
        at = 3 * i
        options = [lines[at + 1 + 7 * k] for k in range(choices)]
        rows.append({"line": lines[at], "choices": options, "answer": 0})
    (d / "next_line.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "next_line.yaml").write_text(TASK.format(data=d / "next_line.jsonl"))
    return d / "next_line.yaml"


def step_seconds(model, vocab: int, steps: int = 20) -> float:
    """One training step of batch 12 × 64 tokens (forward, backward, AdamW), averaged."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, vocab, (12, 65))
    for i in range(steps + 3):
        if i == 3:
            clock = time.perf_counter()
        _, scores = model(x[:, :-1], x[:, 1:])
        loss = scores.mean
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - clock) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--choices", type=int, default=4)
    args = parser.parse_args()
    text = CORPUS.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    tokenizer = CharTokenizer(text)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = build_model(GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=4, n_head=4,
                                  n_embd=128, block_size=64))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        task = write_task(d, lines, args.documents, args.choices)
        checkpoint = save_model_dir(d / "model", model, tokenizer)
        run_tasks([str(task)], checkpoint, d / "warm")  # the harness's imports, once
        clock = time.perf_counter()
        found = run_tasks([str(task)], checkpoint, d / "out", HarnessSettings(batch_size=8))
        scoring = time.perf_counter() - clock
    step = step_seconds(model.train(), tokenizer.vocab_size)
    print(f"acc {found['tasks']['next_line']['acc']:.3f} over {args.documents} documents")
    print("| what | seconds | training steps |\n|---|---:|---:|")
    print(f"| one training step (12 × 64 tokens) | {step:.3f} | 1 |")
    print(f"| one scoring: {args.documents} documents × {args.choices} choices | {scoring:.1f} | "
          f"{scoring / step:.0f} |")


if __name__ == "__main__":
    main()
