"""A toy task for learning from rewards, built locally: a tiny Llama (helpers/hf_models.py), a
table of prompts (a few words each, with an ``id`` and an ``answer`` column), and the reward
functions in a file of their own, as a user writes them: ``vowels`` (the share of the answer's
letters that are vowels, which a random model's answers vary in: GRPO raises it in a few dozen
steps), ``flaky`` (hangs on the prompt with id 3, raises on the one with id 5, else 0), ``broken``
(raises on every batch), and two the door refuses (a column the data lacks, a wrong signature)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from helpers.hf_models import CHAT_TEXTS, build

WORDS = "rose thorn flower sweet name guard Romeo art thou".split()
REWARDS = '''
import time


def vowels(prompts, completions, **columns):
    """The share of the completion's letters that are vowels."""
    out = []
    for c in completions:
        letters = [ch for ch in c.lower() if ch.isalpha()]
        out.append(sum(ch in "aeiou" for ch in letters) / len(letters) if letters else 0.0)
    return out


def flaky(prompts, completions, id, **columns):
    if id[0] == 3:
        time.sleep(600)  # hangs: grpo.reward_timeout_s ends it
    if id[0] == 5:
        raise ValueError("no score for prompt 5")
    return [0.0] * len(completions)


def broken(prompts, completions, **columns):
    raise TypeError("broken on purpose")


def wants_solution(prompts, completions, solution):
    return [0.0] * len(completions)


def wrong(texts):
    return []
'''


def write_task(directory: Path, prompts: int = 120) -> dict[str, Path]:
    """The model, the prompts (JSON Lines) and the reward file, under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    model = build("llama", directory / "model", CHAT_TEXTS * 5)
    rng = random.Random(0)
    rows = []
    for i in range(prompts):
        words = [rng.choice(WORDS) for _ in range(3)]
        rows.append({"id": i, "prompt": " ".join(words), "answer": words[0]})
    table = directory / "prompts.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rewards = directory / "rewards.py"
    rewards.write_text(REWARDS)
    return {"model": model, "prompts": table, "rewards": rewards}


def overrides(task: dict[str, Path], *rewards: str) -> list[str]:
    """A GRPO run on the task: 2 workers, 8 prompts a step, 4 answers of 16 tokens each."""
    specs = ",".join(f"{task['rewards']}:{name}" for name in rewards or ("vowels",))
    return ["model=hf", f"model.path={task['model']}", "data.format=prompts",
            f"data.path={task['prompts']}", "train.objective=grpo", f"grpo.rewards=[{specs}]",
            "grpo.num_generations=4", "grpo.max_new_tokens=16", "train.batch_size=8",
            "train.num_workers=2", "optim.lr=1e-2", "optim.warmup_steps=0"]


class LocalPrompts:
    """A split's prompts as the hand-off gives them (``prompts.dataset.PromptSource``), in
    memory."""

    def __init__(self, rows: list[tuple[int, list[int]]]):
        import numpy as np
        import pyarrow as pa

        from raydp_llm.data.prompts.dataset import TABLE_SCHEMA

        self.rows = pa.Table.from_pylist(
            [{"index": i, "ids": np.asarray(ids, np.int32).tobytes(), "text": "", "columns": "{}"}
             for i, ids in rows], schema=TABLE_SCHEMA)

    def table(self):
        return self.rows
