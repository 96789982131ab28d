"""Hugging Face directories' files, the leaf every model module reads: the weight and config file
names, a tokenizer of this project as a fast tokenizer's files (and back), and an s3:// model's
node-local copy. Only tokenizers and the storage layer: no torch, no transformers."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path

from raydp_llm.core import storage
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import (
    EOD,
    TOKENIZER_FILE,
    WEIGHT_SUFFIXES,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
)

WEIGHTS_FILE = "model.safetensors"  # transformers' names, which the model directory shares
CONFIG_FILE = "config.json"
MODEL_CACHE_ENV = "RAYDP_LLM_MODEL_CACHE"  # set per node by launch/, or by cluster.scratch_dir
READY = ".complete"  # marks a finished node-local copy of an s3:// model


class NotExpressible(InputError):
    """A model the other format cannot hold exactly (the LSTM as GPT-2, a GPT-2 variant this GPT
    lacks)."""


def hf_tokenizer(tokenizer: Tokenizer, block_size: int) -> tuple[str, dict]:
    """``(tokenizer.json, tokenizer_config.json)`` of a fast tokenizer that turns text into the
    same ids as ``tokenizer``: a BPE as it is, a char vocabulary as a word-level model over single
    characters. NotExpressible for pre-tokenized ids (no text to tokenize)."""
    if isinstance(tokenizer, BPETokenizer):
        tok = tokenizer.tok
    elif isinstance(tokenizer, CharTokenizer):
        tok = char_word_level(tokenizer)
    else:
        raise NotExpressible(f"a {tokenizer.kind} tokenizer reads token ids, not text: there is no "
                             "Hugging Face tokenizer to write; export the model alone")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOD, "eos_token": EOD,
              "model_max_length": block_size, "clean_up_tokenization_spaces": False}
    return tok.to_str(), config


def char_word_level(tokenizer: CharTokenizer):
    """A ``tokenizers`` word-level model over ``tokenizer``'s characters, each character a word
    (one id per code point, as CharTokenizer); characters outside the vocabulary fail there too."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {c: i for i, c in enumerate(tokenizer.chars)} | {EOD: tokenizer.eod_id}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))  # not in vocab: unknown fails
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters joined as they are, no spaces between
    tok.add_special_tokens([AddedToken(EOD, special=True, normalized=False)])
    return tok


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def read_hf_tokenizer(directory: str | Path) -> Tokenizer:
    """A GPT-2 directory's ``tokenizer.json`` as this project's tokenizer: a character vocabulary
    written by ``char_word_level`` becomes a CharTokenizer again, anything else a BPETokenizer (any
    ``tokenizers`` model) that has the end-of-document token."""
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise InputError(f"model.init_from={directory}: no {TOKENIZER_FILE}; save the tokenizer "
                         "beside the model (tokenizer.save_pretrained(dir)), as a fast tokenizer")
    tok = HFTokenizer.from_file(str(path))
    chars = _char_vocabulary(tok)
    if chars is not None:
        return CharTokenizer(chars)
    try:
        return BPETokenizer(tok)
    except ValueError as err:
        raise InputError(f"model.init_from={directory}: {err}") from None


def _char_vocabulary(tok) -> str | None:
    """The characters of a word-level tokenizer over single characters, ids in code point order and
    the end-of-document token last, as CharTokenizer numbers them; else None."""
    spec = json.loads(tok.to_str())
    if spec["model"]["type"] != "WordLevel":
        return None
    vocab = dict(spec["model"]["vocab"])
    eod = vocab.pop(EOD, None)
    chars = "".join(sorted(vocab))
    if eod != len(vocab) or any(len(c) != 1 for c in vocab):
        return None
    return chars if all(vocab[c] == i for i, c in enumerate(chars)) else None


def local_copy(path: str, s3: S3Options = S3Options()) -> Path:
    """``path`` itself when local; an s3:// model copied once per node into ``model_cache()`` (the
    first worker copies, the others wait on the lock and find it there)."""
    if not storage.is_s3(path):
        return Path(path)
    target = _cached(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{target}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / READY).exists():
            target.mkdir(exist_ok=True)
            storage.fetch(path, target, s3)
            (target / READY).write_text(path)
    return target


def _cached(uri: str, suffix: str = "") -> Path:
    """Where this node keeps its copy of the s3:// model ``uri`` (or of part of it)."""
    return model_cache() / f"{hashlib.sha256(uri.encode()).hexdigest()[:20]}{suffix}"


def model_cache() -> Path:
    """This process's directory for the copies of s3:// models (read when used: a run's
    ``cluster.scratch_dir`` sets it after the imports)."""
    return Path(os.environ.get(MODEL_CACHE_ENV, Path.home() / ".cache" / "raydp_llm" / "models"))


def tokenizer_dir(path: str, s3: S3Options = S3Options()) -> Path:
    """A local directory with a model's config and tokenizer files: ``path`` itself, or those
    small files of an s3:// model (not its weights) copied for the driver."""
    if not storage.is_s3(path):
        return Path(path)
    target = _cached(path, "-tokenizer")
    target.mkdir(parents=True, exist_ok=True)
    for info in storage.list_objects(path, s3):
        if not info.base_name.endswith(WEIGHT_SUFFIXES):
            storage.copy(storage.join(path, info.base_name), target / info.base_name, s3)
    return target


def is_hf_dir(directory: str | Path, s3: S3Options = S3Options()) -> bool:
    """A Hugging Face directory (``config.json`` names a ``model_type``), not this project's."""
    with contextlib.suppress(OSError, ValueError):
        return "model_type" in storage.read_json(storage.join(str(directory), CONFIG_FILE), s3)
    return False
