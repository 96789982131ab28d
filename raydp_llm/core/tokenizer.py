"""Tokenizers: text ↔ integer ids, with an end-of-document token; saved as ``tokenizer.json``.

``char``: one id per distinct character (vocabulary built by Spark), plus the end-of-document id.
``bpe``: a byte-level BPE from Hugging Face ``tokenizers``, stored in that library's own JSON
format. ``hf``: a model's own tokenizer, as transformers' AutoTokenizer builds it (its files
saved as they are). ``ids``: pre-tokenized input (whitespace-separated integer ids, as Spark+DL4J
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
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # beside it in a Hugging Face directory
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # a chat model's template, as transformers 5 keeps it
# a Hugging Face directory's files that are not its tokenizer's: left out of its hash and copies
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
EOD = "<|endoftext|>"
EOD_TEXT = "\n\n"  # how an end-of-document token reads in generated text


class UnknownCharacters(ValueError):
    """Characters a char tokenizer's vocabulary lacks. The ETL's executors raise it; the driver
    recognises it by its type in the executor's traceback
    (``data.etl.failures.raised_in_executor``) and reads the characters back from its message with
    ``chars_in``: the message's form lives here alone."""

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

    # the ETL encodes a whole document as one text (not paragraph by paragraph): a model's
    # tokenizer must see the texts AutoTokenizer would (SentencePiece-style ones, Llama 2, Mistral,
    # mark the start of a text, so a document cut into paragraphs would encode otherwise)
    whole_documents: bool = False

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def separator(self) -> list[int]:
        """The ids put between two documents: the end-of-document token, if any."""
        return [] if self.eod_id is None else [self.eod_id]

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
        self.save_template(directory)
        return path

    # a chat model's template (data.format=chat), written beside the tokenizer as transformers 5
    # reads it; set by the trainer (TrainSpec.tokenizer), not part of the tokenizer's JSON
    chat_template: str | None = None

    def save_template(self, directory: Path) -> None:
        """The chat template, as transformers 5 reads it beside a model: chat_template.jinja."""
        if self.chat_template is not None:
            (Path(directory) / CHAT_TEMPLATE_FILE).write_text(self.chat_template)


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
        return _fast_ids(self.tok, texts, self.token_dtype)

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


class PretrainedTokenizer(Tokenizer):
    """A model's own tokenizer, as transformers' ``AutoTokenizer`` builds it from a Hugging Face
    directory (``pretrained_tokenizer``): its ``tokenizers`` backend encodes (the executors need
    nothing else), its files are what ``save`` writes. Between documents: EOS, then BOS when the
    tokenizer adds one to each text (Llama, Mistral)."""

    kind = "hf"
    whole_documents = True

    def __init__(self, backend: str, bos_id: int | None, eos_id: int | None, add_bos: bool,
                 files: dict[str, str]):
        from tokenizers import Tokenizer as HFTokenizer

        self.backend, self.tok = backend, HFTokenizer.from_str(backend)
        self.bos_id, self.eod_id, self.add_bos, self.files = bos_id, eos_id, add_bos, files
        self.vocab_size = max(self.tok.get_vocab(with_added_tokens=True).values()) + 1

    def separator(self) -> list[int]:
        bos = [self.bos_id] if self.add_bos and self.bos_id is not None else []
        return super().separator() + bos  # EOS, then BOS

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return _fast_ids(self.tok, texts, self.token_dtype)

    def decode(self, ids) -> str:
        return self.tok.decode(np.asarray(ids).tolist(), skip_special_tokens=False)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "backend": self.backend, "bos_id": self.bos_id,
                           "eos_id": self.eod_id, "add_bos": self.add_bos, "files": self.files})

    def save(self, directory: Path) -> Path:
        for name, text in self.files.items():
            (Path(directory) / name).write_text(text)
        self.save_template(directory)
        return Path(directory) / TOKENIZER_FILE


def _fast_ids(tok, texts: list[str], dtype: np.dtype) -> list[np.ndarray]:
    """Each text's ids from a ``tokenizers.Tokenizer``, no special tokens added."""
    return [np.asarray(e.ids, dtype=dtype)
            for e in tok.encode_batch_fast(texts, add_special_tokens=False)]


def pretrained_tokenizer(directory: str | Path) -> PretrainedTokenizer:
    """The tokenizer of a Hugging Face directory exactly as ``AutoTokenizer`` builds it: its class
    (chosen by model_type) may rebuild tokenizer.json from the vocabulary and merges, so its backend
    and its own saved files are what the executors use and the model directory keeps."""
    import tempfile

    from transformers import AutoTokenizer

    try:
        auto = AutoTokenizer.from_pretrained(str(directory))
    except Exception as err:  # transformers raises many kinds for a directory it cannot read
        raise ValueError(f"{directory}: transformers' AutoTokenizer cannot load its tokenizer "
                         f"({str(err).splitlines()[0][:160]}); save it beside the model with "
                         "tokenizer.save_pretrained") from None
    if not getattr(auto, "is_fast", False):
        raise ValueError(f"{directory}: the tokenizer has no tokenizer.json (a slow, "
                         "sentencepiece-only tokenizer); convert it to a fast one and "
                         "save_pretrained it")
    with_specials = auto("a")["input_ids"]
    plain = auto("a", add_special_tokens=False)["input_ids"]
    bos = auto.bos_token_id
    add_bos = bos is not None and with_specials[:1] == [bos] and plain[:1] != [bos]
    with tempfile.TemporaryDirectory() as tmp:
        auto.save_pretrained(tmp)
        files = {p.name: p.read_text() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    return PretrainedTokenizer(auto.backend_tokenizer.to_str(), bos, auto.eos_token_id, add_bos,
                               files)


def train_bpe(batches: Iterable[list[str]], vocab_size: int,
              specials: tuple[str, ...] = ()) -> BPETokenizer:
    """A byte-level BPE (GPT-2 style) with ``vocab_size`` ids, the first being the end-of-document
    token, then ``specials`` (kept whole: a chat template's markers)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD, *specials],
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((b for b in batches if b), trainer=trainer)
    return BPETokenizer(tok)



def tokenizer_from_json(text: str) -> Tokenizer:
    spec = json.loads(text)
    if spec.get("kind") == CharTokenizer.kind:
        return CharTokenizer(spec["chars"])
    if spec.get("kind") == IdsTokenizer.kind:
        return IdsTokenizer(spec["vocab_size"])
    if spec.get("kind") == PretrainedTokenizer.kind:
        return PretrainedTokenizer(spec["backend"], spec["bos_id"], spec["eos_id"],
                                   spec["add_bos"], spec["files"])
    if "model" in spec:  # Hugging Face tokenizers format
        from tokenizers import Tokenizer as HFTokenizer

        return BPETokenizer(HFTokenizer.from_str(text))
    raise ValueError(f"unknown tokenizer format (kind={spec.get('kind')!r}); expected char, ids or "
                     "a tokenizers JSON")


def load_tokenizer(path: Path) -> Tokenizer:
    """From a ``tokenizer.json`` file, or a directory holding one: a Hugging Face directory's
    (with ``tokenizer_config.json``) as AutoTokenizer builds it."""
    path = Path(path)
    if path.is_dir() and (path / TOKENIZER_CONFIG_FILE).is_file():
        return pretrained_tokenizer(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    return tokenizer_from_json(path.read_text())
