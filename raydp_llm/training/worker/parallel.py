"""How the workers share the model: ``ddp`` (each holds all of it; DDP all-reduces the gradients) or
``fsdp`` (FSDP2: each holds a 1/N shard of every block's parameters, gradients and AdamW state; a
block's parameters are all-gathered for its forward and backward, its gradients reduce-scattered).
Also activation checkpointing, per block, and the reductions the loop needs over sharded tensors.

FSDP2 (``fully_shard``) runs over nccl on GPUs and over gloo on CPUs. Ray Train's
``prepare_model(parallel_strategy="fsdp")`` is the older FSDP1 and refuses CPUs, so the worker
shards its model here, as Ray's own FSDP2 example does.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from raydp_llm.models.hf import HFModel

# FSDP and DTensor are imported by ``shard`` alone: over half a second of CPU that every DDP worker
# would spend at start. Until then no module is an FSDPModule and no tensor a DTensor, so the
# checks below ask only a loaded module (``_loaded``).


def _loaded(module: str, name: str) -> type | None:
    """The class ``module.name`` if ``module`` is imported, else None (nothing is an instance)."""
    return getattr(sys.modules.get(module), name, None)


def _is(obj, module: str, name: str) -> bool:
    cls = _loaded(module, name)
    return cls is not None and isinstance(obj, cls)


def _dtensor(t) -> bool:
    return _is(t, "torch.distributed.tensor", "DTensor")


def _fsdp(module: nn.Module) -> bool:
    return _is(module, "torch.distributed.fsdp", "FSDPModule")


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the own GPT's ``blocks``, a transformers model's decoder layers
    (the classes its ``_no_split_modules`` names: LlamaDecoderLayer, GPT2Block, ...)."""
    if isinstance(model, HFModel):
        names = set(getattr(model.net, "_no_split_modules", None) or ())
        return [m for m in model.net.modules() if type(m).__name__ in names]
    return list(getattr(model, "blocks", ()))


def checkpoint_activations(model: nn.Module) -> None:
    """Each block keeps only its input in the forward pass and recomputes the rest in the
    backward. The block's ``forward`` is wrapped in place (no wrapper module), so parameter names,
    and with them checkpoints, stay those of the plain model."""
    for block in blocks(model):
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def bf16_params(precision: str, device: torch.device) -> bool:
    """Whether FSDP casts the gathered parameters to bf16 (``train.precision``)."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def shard(model: nn.Module, device: torch.device, precision: str) -> nn.Module:
    """``model`` sharded in place over all workers: ``fully_shard`` on each block, then on the
    root (the embeddings, the final norm and the head). With bf16, parameters are gathered and
    computed in bf16 and gradients reduced in fp32; the shards and AdamW stay fp32. The model may
    be on the CPU: each block's shard moves to ``device`` as it is sharded, never the whole
    model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy()
    if bf16_params(precision, device):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    # generation (GRPO's answers) calls ``next_logits``, not ``forward``: the root's parameters
    # are gathered around it too (a transformers model's ``next_logits`` calls its network
    # directly)
    register_fsdp_forward_method(model, "next_logits")
    if device.type == "cpu":
        _return_freed_blocks()
        # gloo's AVG reduction has summed instead of averaging (pytorch issue 162338): reduce
        # with SUM, FSDP dividing by the world size itself
        for module in model.modules():
            if _fsdp(module):
                module.set_force_sum_reduction_for_comms(True)
    return model


def _return_freed_blocks() -> None:
    """On CPU: a freed all-gathered block goes back to the system. glibc raises its mmap
    threshold to the size of a freed mapping, after which blocks are carved from its heap and stay
    resident when freed: FSDP's memory would grow to DDP's. A fixed threshold (M_MMAP_THRESHOLD)
    keeps every large buffer its own mapping."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD = -3


@contextlib.contextmanager
def gradients_accumulated(model: nn.Module):
    """Backward passes whose gradients stay on this worker until a later one: DDP's ``no_sync``;
    FSDP2 keeps the unsharded gradients (a block's full size) instead of reduce-scattering after
    every micro-batch."""
    if _fsdp(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:
        yield


def is_sharded(model: nn.Module) -> bool:
    return any(_dtensor(p) for p in model.parameters())


def local(t: torch.Tensor) -> torch.Tensor:
    """This worker's part of ``t``: its shard of a sharded tensor, else all of it."""
    return t.to_local() if _dtensor(t) else t


def as_float(t: torch.Tensor) -> float:
    """A scalar, gathered when it is a distributed tensor (FSDP's gradient norm)."""
    return (t.full_tensor() if _dtensor(t) else t).item()


def _reduced(values: torch.Tensor, op, sharded: bool) -> torch.Tensor:
    if sharded and dist.is_initialized():
        dist.all_reduce(values, op=op)
    return values


def grad_stats(model: nn.Module) -> dict:
    """Mean, min, max and variance of the gradients' magnitudes (the DL4J projects' gradient
    statistics), over all of the model's gradients: each worker's shards reduced when sharded."""
    sharded = is_sharded(model)
    g = [local(p.grad).detach().abs().flatten().double() for p in model.parameters()
         if p.grad is not None]
    g = torch.cat(g) if g else torch.zeros(0, dtype=torch.float64)
    n_sum_sq = _reduced(torch.stack([torch.tensor(g.numel(), dtype=torch.float64), g.sum(),
                                     (g * g).sum()]), dist.ReduceOp.SUM, sharded)
    low = _reduced(g.min() if g.numel() else torch.tensor(math.inf, dtype=torch.float64),
                   dist.ReduceOp.MIN, sharded)
    high = _reduced(g.max() if g.numel() else torch.tensor(-math.inf, dtype=torch.float64),
                    dist.ReduceOp.MAX, sharded)
    n, total, squares = n_sum_sq.tolist()
    return {
        "grad_abs_mean": total / max(n, 1),
        "grad_abs_min": low.item(),
        "grad_abs_max": high.item(),
        "grad_abs_var": (squares - total * total / n) / (n - 1) if n > 1 else 0.0,
    }


def non_finite_weights(model: nn.Module) -> int:
    """How many parameter tensors hold a NaN or an infinity: the same on every rank (DDP keeps the
    weights equal; FSDP's shards are reduced)."""
    bad = torch.tensor([not torch.isfinite(local(p)).all() for p in model.parameters()],
                       dtype=torch.float64)
    return int(_reduced(bad, dist.ReduceOp.MAX, is_sharded(model)).sum())
