"""The weights a run starts from, as every worker builds them (and the driver, to record a DPO
run's reference: driver/reference.py)."""

from __future__ import annotations

import torch
from torch import nn

from raydp_llm.core.model_config import uses_lora
from raydp_llm.models import gpt2
from raydp_llm.models.factory import build_model
from raydp_llm.training.objectives.reference import without_dropout
from raydp_llm.training.spec import TrainSpec


def starting_model(spec: TrainSpec) -> nn.Module:
    """The model as the spec builds or loads it, from ``spec.seed`` (with a GPT-2 checkpoint's
    weights for ``model.init_from``); for DPO and GRPO without dropout (``spec.without_dropout``).
    Every worker builds the same weights, and so does the driver."""
    torch.manual_seed(spec.seed)
    model = build_model(spec.model, spec.s3, spec.seed)
    if uses_lora(spec.model):  # peft's own draws (values replaced) leave no mark on the RNG
        torch.manual_seed(spec.seed)
    if getattr(spec.model, "init_from", None):  # a GPT-2 checkpoint's weights (models/gpt2.py)
        gpt2.load_gpt2_weights(model, gpt2.read_gpt2_tensors(spec.model.init_from),
                               spec.model.init_from)
    return without_dropout(model) if spec.without_dropout else model
