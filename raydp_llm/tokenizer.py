"""Tokenizers: map text to integer ids and back, and save/load themselves as ``tokenizer.json``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TOKENIZER_FILE = "tokenizer.json"


class CharTokenizer:
    """One id per distinct character, ids in code-point order (the vocabulary Spark builds)."""

    kind = "char"

    def __init__(self, chars: str):
        if not chars:
            raise ValueError("a character vocabulary needs at least one character")
        self.chars = "".join(sorted(set(chars)))
        self._codepoints = np.frombuffer(self.chars.encode("utf-32-le"), dtype=np.uint32)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def token_dtype(self) -> np.dtype:
        """The smallest unsigned integer type that holds every id."""
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text`` as ``token_dtype``; raises ValueError naming characters not in the vocabulary."""
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.searchsorted(self._codepoints, cps)
        ids = np.minimum(ids, len(self._codepoints) - 1)
        unknown = self._codepoints[ids] != cps
        if unknown.any():
            missing = sorted({chr(c) for c in cps[unknown]})
            raise ValueError(f"characters not in the vocabulary: {''.join(missing)!r}")
        return ids.astype(self.token_dtype)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in np.asarray(ids).tolist())

    def save(self, directory: Path) -> Path:
        path = Path(directory) / TOKENIZER_FILE
        path.write_text(json.dumps({"kind": self.kind, "chars": self.chars}, ensure_ascii=False))
        return path


def load_tokenizer(directory: Path) -> CharTokenizer:
    path = Path(directory) / TOKENIZER_FILE
    spec = json.loads(path.read_text())
    if spec.get("kind") != CharTokenizer.kind:
        raise ValueError(f"{path}: unknown tokenizer kind {spec.get('kind')!r} (known: char)")
    return CharTokenizer(spec["chars"])
