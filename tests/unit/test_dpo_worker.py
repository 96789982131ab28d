"""DPO in the worker, plain torch, no Ray (one CPU process of world size 1): windows that are
preference pairs (two flagged records, as the ETL stores them) into the objective, its loss ln 2
at the start, a planted preference learned through the loop's metrics rows, and the reference
(a frozen copy) never moving."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from helpers.pairs import ANSWER, BATCH, BLOCK, TRAIN_PAIRS, VAL_PAIRS, pair_data, pair_spec
from helpers.tiny_loop import CPU, Reports
from raydp_llm.checkpoint.layout import TrainState
from raydp_llm.core import integrity
from raydp_llm.core.dpo_config import DPO_FIGURES
from raydp_llm.core.errors import RunFailure
from raydp_llm.training.driver.metrics import COLUMNS
from raydp_llm.training.driver.reference import starting_dir
from raydp_llm.training.objectives.dpo import logps_of
from raydp_llm.training.objectives.dpo_loss import LN2
from raydp_llm.training.objectives.precomputed import FILE, pair_keys
from raydp_llm.training.worker.loop import TrainLoop
from raydp_llm.training.worker.starting import starting_model
from raydp_llm.training.worker.worker import Worker


def answers(logps) -> list[float]:
    """A reference's log-probabilities of a batch's answers, the chosen then the rejected."""
    return logps.chosen.tolist() + logps.rejected.tolist()


@pytest.fixture(scope="module")
def data() -> dict:
    """Planted-preference pairs (helpers/pairs.py)."""
    return pair_data()


def test_at_the_start_the_policy_is_the_reference_loss_ln2(data):
    """Dropout is off for DPO (0.2 in the config), so the policy's first forward is exactly the
    frozen copy's: the loss is ln 2 and every reward 0."""
    worker = Worker(pair_spec(data), data, CPU)
    (windows_,) = next(worker.data.steps(epoch=0, first_step=0))
    batch = worker.objective.collate(windows_)
    assert batch.inputs.shape == (2 * BATCH, BLOCK)  # the chosen rows, then the rejected
    assert int(batch.counted.sum()) == 2 * BATCH * ANSWER  # only the answers' tokens count
    scored = worker.objective.score(worker.forward, batch)
    assert abs(scored.loss.item() - LN2) < 1e-6 and scored.count == BATCH
    assert scored.sums["chosen_reward"] == 0 and scored.sums["rejected_reward"] == 0
    assert scored.sums["chosen_logp"] < 0


def test_the_driver_rebuilds_the_workers_reference(data, tmp_path):
    """The reference a DPO model from scratch records (model/reference/) is the driver's rebuild
    of the starting weights from the run's seed: exactly the worker's frozen copy, also after the
    worker trained (and drew from torch's generator)."""
    spec = pair_spec(data)
    worker = Worker(spec, data, CPU)
    probe = worker.objective.collate(next(worker.data.steps(epoch=0, first_step=0))[0])
    TrainLoop(worker, TrainState(), Reports(tmp_path)).run()
    rebuilt = starting_model(spec).eval()
    with torch.no_grad():
        assert answers(logps_of(rebuilt, probe)) == answers(worker.objective.reference(probe))
    assert starting_dir(spec) is None  # from scratch: saved, not named


def test_a_planted_preference_is_learned_and_the_reference_stays(data, tmp_path):
    s = pair_spec(data)
    worker = Worker(s, data, CPU)
    reference = worker.objective.reference
    probe = worker.objective.collate(next(worker.data.steps(epoch=0, first_step=0))[0])
    before = answers(reference(probe))
    reports = Reports(tmp_path)
    assert TrainLoop(worker, TrainState(), reports).run()
    first, last = reports.rows[0], reports.rows[-1]
    assert [r["step"] for r in reports.rows] == [40, 80]
    assert last["val_acc"] > 0.9  # the held-out pairs' reward accuracy; chance is 0.5
    assert last["val_loss"] < 0.5 * LN2 and last["val_reward_margin"] > 0
    assert last["val_chosen_reward"] > last["val_rejected_reward"]
    assert last["val_ppl"] is None and last["val_bpc"] is None
    assert last["tokens"] == 80 * BATCH * 2 * BLOCK  # a pair is two rows of the block
    assert all(f"{split}_{k}" in COLUMNS for k in DPO_FIGURES for split in ("train", "val"))
    assert all(math.isfinite(first[f"train_{k}"]) for k in DPO_FIGURES)
    assert answers(reference(probe)) == before  # the frozen copy never trained


def test_with_lora_the_reference_is_the_base_with_its_adapters_off(data, hf_families, tmp_path):
    """No second model: the reference is the policy's own base (its adapters switched off), so
    at the start the loss is ln 2 (the adapters add nothing yet), training moves only the
    adapters, and the reference's logits stay those of the base."""
    from raydp_llm.core.config import HFConfig
    from raydp_llm.core.model_config import LoraSettings
    from raydp_llm.core.tokenizer import load_tokenizer

    model = HFConfig(path=str(hf_families["llama"]), block_size=BLOCK, vocab_size=None,
                     lora=LoraSettings(r=4, alpha=8.0))
    s = replace(pair_spec(data, max_steps=40), model=model,
                tokenizer_json=load_tokenizer(hf_families["llama"]).to_json())
    worker = Worker(s, data, CPU)
    batch = worker.objective.collate(next(worker.data.steps(epoch=0, first_step=0))[0])
    first = worker.objective.score(worker.forward, batch)
    assert abs(first.loss.item() - LN2) < 1e-6
    before = answers(worker.objective.reference(batch))
    trainable = sum(p.numel() for p in worker.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in worker.model.parameters())
    assert trainable < total / 4  # the adapters alone: the reference is no copy of the base
    reports = Reports(tmp_path)
    assert TrainLoop(worker, TrainState(), reports).run()
    assert reports.rows[-1]["train_loss"] < LN2
    after = answers(worker.objective.reference(batch))
    assert after == pytest.approx(before, rel=1e-5)
    assert worker.model.training  # the reference's switch to eval mode was undone


def curve(rows: list[dict]) -> list[float]:
    """Each report's step, train and validation loss and reward accuracy, in one flat list."""
    return [r[k] for r in rows for k in ("step", "train_loss", "val_loss", "val_acc")]


def test_precomputed_log_probabilities_train_as_the_frozen_copy_does(data, tmp_path):
    """dpo.reference=precomputed: the starting weights' log-probabilities of every pair are
    computed before the first step, and the run follows the frozen copy's curve; its checkpoints
    hold the table, and a resumed run reads it (nothing computed again) and ends on the
    uninterrupted curve."""
    copy_run = Reports(tmp_path / "copy")
    TrainLoop(Worker(pair_spec(data), data, CPU), TrainState(), copy_run).run()
    spec = pair_spec(data, checkpoint_interval=40)
    spec = replace(spec, dpo=replace(spec.dpo, reference="precomputed"))
    worker = Worker(spec, data, CPU)
    kept = Reports(tmp_path / "precomputed")
    assert TrainLoop(worker, TrainState(), kept).run()
    every = {k for w in worker.data.every_window() for k in pair_keys(worker.objective.collate(w))}
    assert worker.objective.precomputed.table.keys() == every  # both splits' pairs (two are alike)
    assert TRAIN_PAIRS + VAL_PAIRS - 2 <= len(every) <= TRAIN_PAIRS + VAL_PAIRS
    assert curve(kept.rows) == pytest.approx(curve(copy_run.rows), abs=1e-5)
    step_40 = kept.checkpoints[40]
    assert (step_40 / FILE).is_file() and FILE in integrity.listing(step_40)
    resumed = Worker(spec, data, CPU)
    state = resumed.load_checkpoint(step_40)
    # read, not computed
    assert resumed.objective.precomputed.table == worker.objective.precomputed.table
    rows = Reports(tmp_path / "resumed")
    assert TrainLoop(resumed, state, rows).run()
    assert curve(rows.rows) == pytest.approx(curve(kept.rows)[4:], abs=1e-6)


def test_precomputed_log_probabilities_of_other_starting_weights_are_refused(data, tmp_path):
    """A checkpoint's table is stamped with the starting weights (the model's config, the seed):
    another model's is one line; a checkpoint past step 0 without one too."""
    spec = pair_spec(data, max_steps=4)
    spec = replace(spec, dpo=replace(spec.dpo, reference="precomputed"))
    worker = Worker(spec, data, CPU)
    worker.start(TrainState())
    worker.objective.precomputed.save(tmp_path)
    other = Worker(replace(spec, seed=spec.seed + 1), data, CPU)
    with pytest.raises(RunFailure, match=r"^dpo.reference=precomputed: .*reference_logps.npz "
                                         r"holds the log-probabilities of other starting weights "
                                         r"\(\w+, this run's are \w+\); resume a checkpoint of "
                                         r"this run, or start afresh$"):
        other.objective.precomputed.load(tmp_path)
    with pytest.raises(RunFailure, match=r"the checkpoint of step 3 holds no reference "
                                         r"log-probabilities"):
        other.start(TrainState(step=3))
