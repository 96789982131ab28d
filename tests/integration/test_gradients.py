"""The gradient of one process on any number of workers, through the real wrappers: 2 Ray Train
workers (``TorchTrainer``, gloo) wrap the model with Ray Train's ``prepare_model`` (DDP) or shard it
with the worker's FSDP2 setup (``parallel.shard``), take one optimizer step with the project's own
``Worker``, and their gradients, gathered, equal one process's of the same step, after clipping
(``optim.grad_clip`` active: the norm is far above it), with the same norm before it. For every
objective: language modelling on chat windows whose trained tokens differ from window to window
(the workers' shares of the step are unequal), DPO, and GRPO with each ``grpo.loss_type``."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from ray import cloudpickle

import helpers.chunks
import helpers.grpo_task
from helpers.chunks import chunked
from helpers.grpo_task import LocalPrompts
from helpers.pairs import pair_data, pair_spec
from helpers.tiny_loop import spec as loop_spec
from helpers.tiny_loop import tiny_data
from raydp_llm.core.grpo_config import GrpoSettings
from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.data import windows
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.stream import Sampling, SplitChunks, steps_per_epoch
from raydp_llm.training.objectives import Placement
from raydp_llm.training.worker.worker import Worker

pytestmark = pytest.mark.integration

CLIP = 0.05  # optim.grad_clip: below every case's gradient norm, so every update is clipped
LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
BEES = '''
def bees(prompts, completions, **columns):
    """The share of b's in the answer."""
    return [c.count("b") / max(len(c), 1) for c in completions]
'''


@dataclass(frozen=True)
class Case:
    spec: object  # TrainSpec
    data: dict


def uneven_chat(seed: int = 0, records: int = 64, block: int = 8) -> dict:
    """Chat records whose trained tokens are drawn at random (a quarter to all of a record's),
    so that the windows, and the workers' shares of a step, count unequal numbers of targets."""
    rng = np.random.default_rng(seed)
    packed = []
    for _ in range(records):
        ids = rng.integers(0, 16, block + 1)
        train = rng.random(block + 1) < rng.uniform(0.25, 1.0)
        packed.append(chat_tokens.pack(ids, train, np.arange(block + 1) == 0))
    stream = np.concatenate(packed)
    n = len(stream)
    segments_of = functools.partial(windows.segments, n=n, split="tail", val_fraction=0.25,
                                    seed=0, segment_tokens=8192)
    index, sources = chunked(stream, [n], segments_of, 4 * (block + 1), block + 1)
    return {name: SplitChunks(sources[name], index[name]) for name in index}


def clipped(spec):
    return replace(spec, optim=replace(spec.optim, grad_clip=CLIP))


def lm_case() -> Case:
    """The tiny GPT on uneven chat windows, 2 accumulated micro-batches a worker."""
    data, block = uneven_chat(), 8
    base = loop_spec(tiny_data(), max_steps=1)
    sampling = {name: Sampling(block, block + 1) for name in data}
    spec = replace(base, sampling=sampling, token_dtype="uint32", chars_per_token=None,
                   chat_template="", train=replace(base.train, batch_size=8, grad_accum=2),
                   steps_per_epoch=steps_per_epoch(sampling["train"].windows(
                       data["train"].index), 8))
    return Case(clipped(spec), data)


def grpo_case(reward_file: Path, loss_type: str) -> Case:
    """GRPO on the tiny GPT: 4 prompts a step, 4 answers of at most 6 tokens each, ending at "a"
    (so they differ in length), a frozen reference (beta > 0)."""
    base = loop_spec(tiny_data(), max_steps=1)
    train = replace(base.train, objective="grpo", batch_size=4, grad_accum=1, eval_interval=1,
                    checkpoint_interval=0, eval_batches=None)
    grpo = GrpoSettings(num_generations=4, max_new_tokens=6, beta=0.1, temperature=1.5,
                        rewards=[f"{reward_file}:bees"], loss_type=loss_type)
    spec = replace(base, train=train, grpo=grpo, sampling={}, steps_per_epoch=2,
                   tokenizer_json=CharTokenizer("abcdefghijklmnop").to_json(), answer_end="a")
    prompts = {"train": LocalPrompts([(i, [1 + i % 5, 2, 3]) for i in range(8)]),
               "val": LocalPrompts([(8, [4, 5])])}
    return Case(clipped(spec), prompts)


def cases(reward_file: Path) -> dict[str, Case]:
    pairs = pair_data()
    return {"lm": lm_case(), "dpo": Case(clipped(pair_spec(pairs, max_steps=1)), pairs),
            **{f"grpo_{t}": grpo_case(reward_file, t) for t in LOSS_TYPES}}


def one_step(spec, data: dict, placement: Placement, prepare=None) -> dict:
    """A worker's first optimizer step: its gradients after clipping (gathered from the shards),
    and their norm before it."""
    worker = Worker(spec, data, placement, prepare=prepare)
    try:
        step = worker.train_step(next(worker.data.steps(epoch=0, first_step=0)), lr=1e-3)
        grads = {}
        for name, p in worker.model.named_parameters():
            if p.grad is not None:
                g = p.grad
                grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach()
        return {"grads": grads, "grad_norm": step.grad_norm}
    finally:
        calls = getattr(worker.objective, "calls", None)
        if calls is not None:
            calls.close()


def on_two_workers(config: dict) -> None:
    """Each case's step with DDP (Ray Train's ``prepare_model``) and with FSDP2; rank 0 saves
    them."""
    import ray.train.torch

    from raydp_llm.training.worker.loop import ray_placement

    placement, found = ray_placement(), {}
    for name, case in config["cases"].items():
        for strategy in ("ddp", "fsdp"):
            spec = replace(case.spec, train=replace(case.spec.train, strategy=strategy))
            prepare = ray.train.torch.prepare_model if strategy == "ddp" else None
            found[f"{name}/{strategy}"] = one_step(spec, case.data, placement, prepare)
    if placement.rank == 0:
        torch.save(found, config["out"])


@pytest.fixture(scope="module")
def steps(ray_cluster, tmp_path_factory) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # Ray's workers cannot import the tests' modules: this one and the classes of the stored
    # chunks and prompts go by value
    for module in (sys.modules[__name__], helpers.chunks, helpers.grpo_task):
        cloudpickle.register_pickle_by_value(module)
    tmp = tmp_path_factory.mktemp("gradients")
    (tmp / "bees.py").write_text(BEES)
    every = cases(tmp / "bees.py")
    out = tmp / "two.pt"
    TorchTrainer(on_two_workers, train_loop_config={"cases": every, "out": str(out)},
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                 torch_config=TorchConfig(backend="gloo"),
                 run_config=RunConfig(name="gradients", storage_path=str(tmp / "runs"))).fit()
    one = Placement(0, 1, 0, torch.device("cpu"))
    return {"one": {name: one_step(c.spec, c.data, one) for name, c in every.items()},
            "two": torch.load(out, weights_only=True)}


@pytest.mark.parametrize("case", ["lm", "dpo", *(f"grpo_{t}" for t in LOSS_TYPES)])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_workers_take_the_clipped_step_of_one_process(steps, case, strategy):
    one, two = steps["one"][case], steps["two"][f"{case}/{strategy}"]
    assert one["grad_norm"] > 2 * CLIP  # the clip acts
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert one["grads"].keys() == two["grads"].keys()
    for name, g in one["grads"].items():
        assert torch.allclose(two["grads"][name], g, rtol=1e-4, atol=1e-7), name
    total = torch.cat([g.flatten() for g in one["grads"].values()]).norm()
    assert total.item() == pytest.approx(CLIP, rel=1e-3)  # clipped to optim.grad_clip
