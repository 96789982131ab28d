"""Local lm-evaluation-harness tasks over JSON Lines made in a test: a multiple-choice task
(``tiny_mc``, accuracy) and a generation task (``tiny_gen``, exact match), about four plays."""

from __future__ import annotations

import json
from pathlib import Path

QUESTIONS = [("Who loves Juliet?", ["Romeo", "Tybalt", "Paris"], 0),
             ("Who is the Moor?", ["Iago", "Othello", "Cassio"], 1),
             ("Who sees the ghost?", ["Hamlet", "Lear", "Puck"], 0),
             ("Who is the fairy king?", ["Prospero", "Oberon", "Macbeth"], 1)]
MC_TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
GEN_TASK = """task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}} "
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 4
  do_sample: false
metric_list:
  - metric: exact_match
"""


def task_rows() -> list[dict]:
    """The tasks' rows: a question, its choices, the answer's index and text."""
    return [{"question": q, "choices": c, "answer": a, "target": c[a]} for q, c, a in QUESTIONS]


def write_tasks(directory: Path) -> dict[str, Path]:
    """``data.jsonl`` and the two task YAMLs over it in ``directory``: their paths by kind."""
    (directory / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in task_rows()))
    (directory / "mc.yaml").write_text(MC_TASK.format(data=directory / "data.jsonl"))
    (directory / "gen.yaml").write_text(GEN_TASK.format(data=directory / "data.jsonl"))
    return {"mc": directory / "mc.yaml", "gen": directory / "gen.yaml"}
