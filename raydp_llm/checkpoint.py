"""The model directory: ``model.safetensors`` + ``config.json`` + ``tokenizer.json``; loads without Ray or Spark."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from raydp_llm.model import GPT, GPTConfig
from raydp_llm.tokenizer import Tokenizer, load_tokenizer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def save_model_dir(directory: Path, model: GPT, tokenizer: Tokenizer) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, directory / WEIGHTS_FILE)  # lm_head is tied to wte: stored once
    (directory / CONFIG_FILE).write_text(json.dumps({"model": "gpt", **model.config.to_dict()}, indent=2))
    tokenizer.save(directory)
    return directory


def load_model_dir(directory: Path, device: str = "cpu") -> tuple[GPT, Tokenizer]:
    directory = Path(directory)
    if not (directory / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{directory}: no {WEIGHTS_FILE}; give the model/ directory of a finished run")
    spec = json.loads((directory / CONFIG_FILE).read_text())
    spec.pop("model")
    model = GPT(GPTConfig(**spec))
    state = load_file(directory / WEIGHTS_FILE, device=device)
    state["lm_head.weight"] = state["wte.weight"]
    model.load_state_dict(state)
    return model.to(device).eval(), load_tokenizer(directory)


def sample_text(model: GPT, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, temperature: float,
                top_k: int | None, seed: int) -> str:
    """``prompt`` continued by the model; the same seed gives the same text."""
    idx = torch.as_tensor(tokenizer.encode(prompt).astype("int64"))[None, :]
    gen = torch.Generator().manual_seed(seed)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0].tolist())
