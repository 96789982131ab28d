"""The model directory (``model.safetensors`` + ``config.json`` + ``tokenizer.json``; loads without Ray or Spark)
and training checkpoints: a model directory plus ``train_state.json`` (step, data position, run fingerprint) and
``train_state.pt`` (optimizer and RNG state, loaded with ``weights_only=True``: nothing arbitrary is unpickled).
Both may live on S3 (``s3://...``): they are read from there directly, or fetched to a temporary directory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from raydp_llm import storage
from raydp_llm.model import LanguageModel, build_model
from raydp_llm.storage import S3Options
from raydp_llm.tokenizer import TOKENIZER_FILE, Tokenizer, load_tokenizer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MODEL_FILES = (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE)
STATE_JSON = "train_state.json"
STATE_TENSORS = "train_state.pt"


def save_model_dir(directory: Path, model: LanguageModel, tokenizer: Tokenizer) -> Path:
    """Weights (a tied lm_head is wte: stored once), ``{"model": kind, **config}`` and the tokenizer."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tied = model.config.tie_weights
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, directory / WEIGHTS_FILE)
    (directory / CONFIG_FILE).write_text(json.dumps({"model": model.kind, **model.config.to_dict()}, indent=2))
    tokenizer.save(directory)
    return directory


def _load_weights(directory: Path, model: LanguageModel, device: str) -> None:
    """The weights of a model directory into ``model`` (a tied lm_head is stored once, as wte)."""
    state = load_file(Path(directory) / WEIGHTS_FILE, device=device)
    if model.config.tie_weights:
        state["lm_head.weight"] = state["wte.weight"]
    model.load_state_dict(state)


def read_model_spec(directory: str | Path, s3: S3Options = S3Options()) -> dict:
    """A model directory's (or checkpoint's, local or S3) ``config.json`` as a ``build_model`` spec: ``kind`` and
    the config fields."""
    config = storage.read_json(storage.join(str(directory), CONFIG_FILE), s3)
    return {"kind": config.pop("model"), **config}


def load_model_dir(directory: str | Path, device: str = "cpu",
                   s3: S3Options = S3Options()) -> tuple[LanguageModel, Tokenizer]:
    """The model (in eval mode) and tokenizer of a model directory, local or on S3 (fetched to a temporary
    directory); safetensors and JSON only, nothing unpickled."""
    if storage.is_s3(str(directory)):
        with tempfile.TemporaryDirectory() as local:
            storage.fetch(str(directory), local, s3)
            return _load_local(Path(local), device, shown_as=str(directory))
    return _load_local(Path(directory), device, shown_as=str(directory))


def _load_local(directory: Path, device: str, shown_as: str) -> tuple[LanguageModel, Tokenizer]:
    if not (directory / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{shown_as}: no {WEIGHTS_FILE}; give the model/ directory of a finished run")
    model = build_model(read_model_spec(directory))
    _load_weights(directory, model, device)
    return model.to(device).eval(), load_tokenizer(directory)


def _prompt_ids(model: LanguageModel, tokenizer: Tokenizer, prompt: str) -> torch.Tensor:
    """``prompt`` as token ids (1, T) on the model's device."""
    ids = tokenizer.encode(prompt)
    if len(ids) == 0:
        raise ValueError("the prompt is empty; give at least one token of text")
    return torch.as_tensor(ids.astype("int64"), device=model.wte.weight.device)[None, :]


def sample_text(model: LanguageModel, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, temperature: float,
                top_k: int | None, seed: int) -> str:
    """``prompt`` continued by the model; the same seed gives the same text."""
    idx = _prompt_ids(model, tokenizer, prompt)
    gen = torch.Generator(device=idx.device).manual_seed(seed)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0].tolist())


@torch.no_grad()
def top_next_tokens(model: LanguageModel, tokenizer: Tokenizer, prompt: str, k: int) -> list[tuple[str, float]]:
    """The ``k`` most likely tokens right after ``prompt``, decoded, with their probabilities, most likely first."""
    logits, _ = model(_prompt_ids(model, tokenizer, prompt)[:, -model.config.block_size:])
    probs, ids = F.softmax(logits[0, -1].float(), dim=-1).topk(min(k, logits.size(-1)))
    return [(tokenizer.decode([i]), p) for i, p in zip(ids.tolist(), probs.tolist())]


def save_train_checkpoint(directory: Path, model: LanguageModel, tokenizer: Tokenizer, optimizer, state: dict) -> Path:
    """A model directory plus what resuming needs: ``state`` (JSON: step, epoch, position, fingerprint, ...),
    the optimizer's state and the torch RNG."""
    save_model_dir(directory, model, tokenizer)
    (Path(directory) / STATE_JSON).write_text(json.dumps(state, indent=2))
    torch.save({"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()},
               Path(directory) / STATE_TENSORS)
    return Path(directory)


def load_train_checkpoint(directory: Path, model: LanguageModel, optimizer) -> dict:
    """Restore weights, optimizer and RNG from a training checkpoint into ``model`` and ``optimizer``;
    returns its state (JSON)."""
    directory = Path(directory)
    _load_weights(directory, model, str(model.wte.weight.device))
    tensors = torch.load(directory / STATE_TENSORS, weights_only=True)
    optimizer.load_state_dict(tensors["optimizer"])
    torch.set_rng_state(tensors["torch_rng"])
    return json.loads((directory / STATE_JSON).read_text())


def find_checkpoint(root: str | Path, fingerprint: str, max_steps: int, s3: S3Options = S3Options(),
                    run_prefix: str = "") -> str | None:
    """The latest training checkpoint under ``root`` (local or S3) of an unfinished run with the same
    ``fingerprint`` (the same model, data, optimizer and training settings) whose path below ``root`` starts with
    ``run_prefix``, or None. A run that reached ``max_steps`` is finished: its checkpoints are not resumed."""
    found, finished = [], set()
    for path, relative, info in storage.find_files(root, STATE_JSON, s3):
        state = storage.read_json(path, s3)
        if relative.startswith(run_prefix) and state.get("fingerprint") == fingerprint:
            run_dir, checkpoint_dir = path.rsplit("/", 2)[0], path.rsplit("/", 1)[0]
            found.append((state["step"], info.mtime, checkpoint_dir, run_dir))
            if state["step"] >= max_steps:
                finished.add(run_dir)
    unfinished = [f for f in found if f[3] not in finished]
    return max(unfinished)[2] if unfinished else None


def export_model_dir(checkpoint_dir: Path, directory: Path) -> Path:
    """Copy the model files (not the optimizer state) of a checkpoint into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        shutil.copy2(Path(checkpoint_dir) / name, directory / name)
    return directory
