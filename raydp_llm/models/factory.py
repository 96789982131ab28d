"""The model factory: the model a config describes (the own GPT and LSTM, or a transformers
family), with its token embeddings read from a file and frozen when the config says so. The one
module that knows every family."""

from __future__ import annotations

from pathlib import Path

import torch

from raydp_llm.core.model_config import ModelConfig
from raydp_llm.models.base import LanguageModel
from raydp_llm.models.embeddings import embeddings_error, read_embeddings
from raydp_llm.models.gpt import GPT
from raydp_llm.models.lstm import LSTMLM

MODELS = {cls.kind: cls for cls in (GPT, LSTMLM)}


def build_model(cfg: ModelConfig, s3=None, seed: int = 0) -> LanguageModel:
    """The model ``cfg`` describes (``vocab_size`` set; a transformers family from
    models/hf.py, ``s3`` (S3Options) reaching an s3:// ``model.path``, a fresh Llama's weights and
    LoRA's adapters drawn from ``seed``: the run's; the own models draw from torch's RNG, which
    the caller seeds), its token embeddings
    from ``cfg.init_embeddings`` when given (``read_embeddings``; ids the file lacks keep their
    random init) and frozen with ``cfg.freeze_embeddings`` (no gradient for wte, nor for the head
    when tied)."""
    if cfg.kind in MODELS:
        model = MODELS[cfg.kind](cfg)
    else:
        from raydp_llm.models.hf import build_pretrained  # transformers: only for them

        model = build_pretrained(cfg, s3, seed)
    if getattr(cfg, "init_embeddings", None) is not None:
        if not Path(cfg.init_embeddings).is_file():
            raise embeddings_error(
                cfg.init_embeddings, "no such file", "give a CSV or .npy file of token vectors"
            )
        ids, vectors = read_embeddings(cfg.init_embeddings, cfg.vocab_size, cfg.n_embd)
        with torch.no_grad():
            model.wte.weight[ids] = vectors.to(model.wte.weight)
    if getattr(cfg, "freeze_embeddings", False):
        model.wte.weight.requires_grad_(False)
    return model
