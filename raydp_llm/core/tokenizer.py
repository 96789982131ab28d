"""Tokenizers: text ↔ integer ids, with an end-of-document token; saved as ``tokenizer.json``.

``char``: one id per distinct character (vocabulary built by Spark), plus the end-of-document id.
``bpe``: a byte-level BPE from Hugging Face ``tokenizers``, stored in that library's own JSON
format. ``ids``: pre-tokenized input (whitespace-separated integer ids, as Spark+DL4J
``tokenids.txt``); no end-of-document token is added. ``char`` and ``bpe`` render the
end-of-document token as a blank line.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import Iterable

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
EOD = "<|endoftext|>"
EOD_TEXT = "\n\n"  # how an end-of-document token reads in generated text


class UnknownCharacters(ValueError):
    """Characters a char tokenizer's vocabulary lacks. The ETL's executors raise it; the driver
    recognises it by its type in the executor's traceback (``data.prepare.raised_in_executor``) and
    reads the characters back from its message with ``chars_in``: the message's form lives here
    alone."""

    PREFIX = "characters not in the vocabulary: "

    def __init__(self, chars: str):
        super().__init__(f"{self.PREFIX}{chars!r}")
        self.chars = chars

    @classmethod
    def chars_in(cls, message: str) -> str:
        return ast.literal_eval(message.removeprefix(cls.PREFIX))


class Tokenizer:
    """What the ETL, the trainer and generation need from a tokenizer."""

    kind: str
    eod_id: int | None  # None: the tokenizer adds no end-of-document token
    vocab_size: int

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    @property
    def token_dtype(self) -> np.dtype:
        """The smallest unsigned integer type that holds every id."""
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def save(self, directory: Path) -> Path:
        path = Path(directory) / TOKENIZER_FILE
        path.write_text(self.to_json())
        return path


class CharTokenizer(Tokenizer):
    kind = "char"

    def __init__(self, chars: str):
        self.chars = "".join(sorted(set(chars)))
        if not self.chars:
            raise ValueError("a character vocabulary needs at least one character")
        self._codepoints = np.frombuffer(self.chars.encode("utf-32-le"), dtype=np.uint32)
        self.eod_id = len(self.chars)
        self.vocab_size = len(self.chars) + 1

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Ids of each text; one vectorized lookup for the whole batch. Unknown characters raise
        ValueError."""
        cps = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
        ids = np.minimum(np.searchsorted(self._codepoints, cps), len(self._codepoints) - 1)
        unknown = self._codepoints[ids] != cps
        if unknown.any():
            missing = "".join(sorted({chr(c) for c in cps[unknown]}))
            raise UnknownCharacters(missing)
        ids = ids.astype(self.token_dtype)
        return np.split(ids, np.cumsum([len(t) for t in texts])[:-1])

    def decode(self, ids) -> str:
        return "".join(
            EOD_TEXT if i == self.eod_id else self.chars[i] for i in np.asarray(ids).tolist()
        )

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "chars": self.chars, "eod": EOD}, ensure_ascii=False)


class BPETokenizer(Tokenizer):
    kind = "bpe"

    def __init__(self, tokenizer):  # a tokenizers.Tokenizer
        self.tok = tokenizer
        eod = tokenizer.token_to_id(EOD)
        if eod is None:
            raise ValueError(f"the BPE tokenizer has no {EOD} token; add it as a special token")
        self.eod_id = eod
        self.vocab_size = tokenizer.get_vocab_size()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        dtype = self.token_dtype
        return [
            np.asarray(e.ids, dtype=dtype)
            for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)
        ]

    def decode(self, ids) -> str:
        return self.tok.decode(np.asarray(ids).tolist(), skip_special_tokens=False).replace(
            EOD, EOD_TEXT
        )

    def to_json(self) -> str:
        return self.tok.to_str()


class IdsTokenizer(Tokenizer):
    kind = "ids"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eod_id = None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's whitespace-separated ids; raises ValueError on a token that is not an id in
        range."""
        out = []
        for text in texts:
            ids = np.array(text.split(), dtype=np.int64)
            if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}): got "
                                 f"{ids.min()}..{ids.max()}")
            out.append(ids.astype(self.token_dtype))
        return out

    def decode(self, ids) -> str:
        return " ".join(str(i) for i in np.asarray(ids).tolist())

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "vocab_size": self.vocab_size})


def train_bpe(batches: Iterable[list[str]], vocab_size: int) -> BPETokenizer:
    """A byte-level BPE (GPT-2 style) with ``vocab_size`` ids, the first being the end-of-document
    token."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((b for b in batches if b), trainer=trainer)
    return BPETokenizer(tok)



def tokenizer_from_json(text: str) -> Tokenizer:
    spec = json.loads(text)
    if spec.get("kind") == CharTokenizer.kind:
        return CharTokenizer(spec["chars"])
    if spec.get("kind") == IdsTokenizer.kind:
        return IdsTokenizer(spec["vocab_size"])
    if "model" in spec:  # Hugging Face tokenizers format
        from tokenizers import Tokenizer as HFTokenizer

        return BPETokenizer(HFTokenizer.from_str(text))
    raise ValueError(f"unknown tokenizer format (kind={spec.get('kind')!r}); expected char, ids or "
                     "a tokenizers JSON")


def load_tokenizer(path: Path) -> Tokenizer:
    """From a ``tokenizer.json`` file or a directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    return tokenizer_from_json(path.read_text())
