"""The starting weights as a reference that never trains (DPO's, and GRPO's with ``grpo.beta`` >
0): a frozen copy, or with LoRA the model itself with its adapters switched off
(``reference_weights``); and the model without dropout (``without_dropout``), so that at the first
step the policy is exactly the reference."""

from __future__ import annotations

import contextlib
import copy

from torch import nn


def without_dropout(model: nn.Module) -> nn.Module:
    """Every dropout of ``model`` off (as TRL's DPO does): the policy at its first step is then
    exactly the reference, and the rewards measure the weights, not the dropout masks. Dropout
    modules, and the rates attention layers keep as numbers (the GPT's ``dropout``, transformers'
    ``attention_dropout``)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name in ("dropout", "attention_dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    return model


def frozen_copy(model: nn.Module) -> nn.Module:
    """The starting weights as a second model that never trains: taken before the policy is
    wrapped or sharded, in eval mode, without gradients."""
    return frozen(copy.deepcopy(model))


def frozen(model: nn.Module) -> nn.Module:
    """``model`` in eval mode, without gradients: a reference that never trains."""
    model.eval().requires_grad_(False)
    return model


@contextlib.contextmanager
def reference_weights(model: nn.Module, reference: nn.Module):
    """The module that gives the reference's figures within the block: ``reference`` (a frozen
    copy); or, when the reference is ``model`` itself (LoRA), ``model`` with its adapters off, in
    eval mode."""
    if reference is not model:
        yield reference
        return
    with model.net.disable_adapter(), evaluating(model):
        yield model


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """``model`` in eval mode within the block; its mode before, after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)
