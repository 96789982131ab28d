"""The worker's training loop in plain torch, no Ray: one CPU process of world size 1 (the
all-reduces have nothing to reduce), a tiny GPT on a tiny in-memory corpus. The optimizer step, the
metrics rows of a few evaluations, the checkpoints and their ``train_state.json``, and the
divergence stop."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers.tiny_loop import BATCH, BLOCK, CPU, Reports, spec, tiny_data
from raydp_llm.checkpoint.layout import STATE_JSON, TrainState
from raydp_llm.training.objectives import all_reduce_max, all_reduce_sum
from raydp_llm.training.objectives.lm import bits_per_char
from raydp_llm.training.worker.loop import TrainLoop, divergence
from raydp_llm.training.worker.optim import lr_at
from raydp_llm.training.worker.worker import Worker


@pytest.fixture(scope="module")
def data():
    """The tiny corpus (helpers.tiny_loop.tiny_data)."""
    return tiny_data()


def test_a_train_step_lowers_the_loss_and_changes_the_weights(data):
    worker = Worker(spec(data), data, CPU)
    group = next(worker.data.steps(epoch=0, first_step=0))
    before = [p.detach().clone() for p in worker.model.parameters()]
    losses = []
    for _ in range(8):
        result = worker.train_step(group, lr=1e-2)
        worker.optimizer.zero_grad(set_to_none=True)
        losses.append(result.loss)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] * 0.8
    assert result.count == BATCH * BLOCK and math.isfinite(result.grad_norm)
    assert all(not torch.equal(a, b) for a, b in zip(before, worker.model.parameters()))


def test_a_few_loop_steps_report_a_row_per_evaluation_and_checkpoint(data, tmp_path):
    s = spec(data)
    reports = Reports(tmp_path)
    state = TrainState()
    assert s.steps_per_epoch == 4 and TrainLoop(Worker(s, data, CPU), state, reports).run()
    rows = reports.rows
    assert [r["step"] for r in rows] == [2, 4, 6] and [r["epoch"] for r in rows] == [0, 0, 1]
    for r in rows:
        assert math.isfinite(r["train_loss"]) and math.isfinite(r["val_loss"])
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, s))  # the lr of the row's last step
        assert r["val_bpc"] == pytest.approx(bits_per_char(r["val_loss"], 2.0))
        assert r["tokens"] == r["step"] * BATCH * BLOCK and r["workers"] == 1
        assert 0 <= r["train_acc"] <= 1 and r["grad_abs_max"] >= r["grad_abs_min"]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert (state.step, state.epoch, state.step_in_epoch) == (6, 1, 2)
    assert sorted(reports.checkpoints) == [4, 6]  # checkpoint_interval, and the end
    saved = json.loads((reports.checkpoints[6] / STATE_JSON).read_text())
    assert list(saved) == ["step", "epoch", "step_in_epoch", "elapsed_s", "fingerprint",
                           "max_steps", "world"]  # the keys of every train_state.json so far
    assert saved | {"elapsed_s": 0} == {"step": 6, "epoch": 1, "step_in_epoch": 2, "elapsed_s": 0,
                                        "fingerprint": "f" * 20, "max_steps": 6, "world": 1}


def test_a_resumed_loop_goes_on_from_its_checkpoint(data, tmp_path):
    """Step 4's checkpoint, loaded into a fresh worker, continues to the end with the same rows."""
    s = spec(data)
    whole = Reports(tmp_path / "whole")
    TrainLoop(Worker(s, data, CPU), TrainState(), whole).run()
    worker = Worker(s, data, CPU)
    state = worker.load_checkpoint(whole.checkpoints[4])
    assert (state.step, state.epoch, state.step_in_epoch) == (4, 0, 4)  # then epoch 1
    resumed = Reports(tmp_path / "resumed")
    assert TrainLoop(worker, state, resumed).run()
    assert [r["step"] for r in resumed.rows] == [6]
    assert resumed.rows[0]["train_loss"] == pytest.approx(whole.rows[-1]["train_loss"], rel=1e-4)


def test_the_train_state_keeps_the_keys_of_train_state_json():
    saved = {"step": 40, "epoch": 1, "step_in_epoch": 7, "elapsed_s": 12.5,
             "fingerprint": "abc", "max_steps": 160, "world": 2}
    assert TrainState.from_json(saved).to_json() == saved
    assert list(TrainState.from_json(saved).to_json()) == list(saved)


def test_a_non_finite_gradient_ends_the_loop_with_a_divergence_report(data, tmp_path):
    worker = Worker(spec(data), data, CPU)
    with torch.no_grad():
        worker.model.wte.weight[0, 0] = float("nan")
    reports = Reports(tmp_path)
    assert not TrainLoop(worker, TrainState(), reports).run()
    assert reports.rows == [{"step": 1, "diverged": "loss nan, gradient norm nan"}]
    assert reports.checkpoints == {}


def test_a_non_finite_evaluation_is_a_divergence_not_a_report(data, tmp_path):
    worker = Worker(spec(data), data, CPU)
    reports = Reports(tmp_path)
    loop = TrainLoop(worker, TrainState(step=4), reports)
    assert not loop.reported({"step": 4, "train_loss": 2.0, "val_loss": float("inf")})
    assert reports.rows == [{"step": 4, "diverged": "val_loss inf"}] and not reports.checkpoints
    with torch.no_grad():
        worker.model.lm_head.weight[0, 0] = float("nan")
    assert divergence({"train_loss": float("nan"), "val_loss": 1.0}, worker.model) == (
        "train_loss nan, 1 weight tensors with NaN or infinite values")


def test_the_all_reduces_are_the_values_themselves_in_one_process():
    assert all_reduce_sum(1.5, 2, 3) == [1.5, 2.0, 3.0] and all_reduce_max(4, 1) == [4.0, 1.0]
