"""A default never refuses a run: a setting left at its default follows the settings the user gave
(``train.checkpoint_interval`` follows ``train.eval_interval``, ``optim.min_lr`` follows
``optim.lr``); only values the user gave are refused, by a line that names what to change."""

from __future__ import annotations

import pytest

from helpers.configs import make_config
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.checks import validate
from raydp_llm.core.config import OptimSettings, TrainSettings, nearest_multiple
from raydp_llm.core.errors import InputError


@pytest.mark.parametrize("step,nearest", [
    (250, 1000), (60, 1020), (400, 800), (300, 900), (128, 1024), (1000, 1000), (1500, 1500),
    (3000, 3000), (1, 1000), (7, 1001),
])
def test_nearest_multiple_is_the_nearest_the_smaller_on_a_tie_and_at_least_one(step, nearest):
    assert nearest_multiple(step, 1000) == nearest


def test_the_default_checkpoint_interval_is_the_evaluation_nearest_1000_steps():
    assert make_config().train.checkpoint_interval is None
    assert make_config().train.checkpoint_every == 1000  # eval_interval=250: as before
    assert TrainSettings(eval_interval=60).checkpoint_every == 1020
    assert TrainSettings(eval_interval=60, checkpoint_interval=120).checkpoint_every == 120
    assert TrainSettings(checkpoint_interval=0).checkpoint_every == 0  # only the final one


def test_eval_interval_alone_is_never_refused_by_the_checkpoint_default():
    cfg = make_config("train.eval_interval=60")
    validate(cfg)
    assert cfg.train.checkpoint_every == 1020


@pytest.mark.parametrize("experiment", ["shakespeare_char", "emr", "smoke"])
def test_an_experiments_eval_interval_may_change_alone(experiment, shakespeare):
    cfg = make_config(f"+experiment={experiment}", "train.eval_interval=60",
                      f"data.path={shakespeare}", "train.storage_path=/tmp/raydp_llm_test_storage")
    validate(cfg)
    assert cfg.train.checkpoint_every == 1020


def test_a_given_checkpoint_interval_off_the_evaluations_is_refused_naming_both():
    cfg = make_config("train.eval_interval=60", "train.checkpoint_interval=1000")
    with pytest.raises(InputError) as e:
        check_inputs(cfg)
    assert str(e.value) == (
        "train.checkpoint_interval=1000 is not a multiple of train.eval_interval=60; checkpoints "
        "are taken at evaluations: set train.checkpoint_interval to a multiple of 60 (e.g. 960 "
        "or 1020), or to null (the evaluation nearest 1000 steps)")


def test_a_given_checkpoint_interval_below_the_evaluations_suggests_the_first_one():
    with pytest.raises(InputError, match=r"a multiple of 250 \(e\.g\. 250\), or to null"):
        validate(make_config("train.checkpoint_interval=100"))


def test_the_default_min_lr_follows_lr():
    assert make_config().optim.min_lr is None
    assert make_config().optim.end_lr == pytest.approx(1e-4)  # lr=1e-3: as before
    assert OptimSettings(lr=3e-3).end_lr == pytest.approx(1e-4)
    assert OptimSettings(lr=5e-5).end_lr == pytest.approx(5e-6)
    assert OptimSettings(lr=5e-5, min_lr=0.0).end_lr == 0.0


def test_a_low_lr_alone_is_never_refused_by_the_min_lr_default():
    validate(make_config("optim.lr=5e-5"))


def test_a_given_min_lr_above_lr_is_refused_naming_both():
    with pytest.raises(InputError, match=r"optim\.min_lr=0\.0001 is above optim\.lr=5e-05; .*"
                                         r"lower optim\.min_lr, or set it to null"):
        validate(make_config("optim.lr=5e-5", "optim.min_lr=1e-4"))


def test_a_batch_the_workers_cannot_split_is_refused_with_batches_they_can():
    with pytest.raises(InputError, match=r"train\.batch_size=12 is not divisible by "
                                         r"train\.num_workers=5 × train\.grad_accum=1; .* set "
                                         r"train\.batch_size to a multiple of 5 \(e\.g\. 10 or "
                                         r"15\)$"):
        validate(make_config("train.num_workers=5", "cluster.num_cpus=8"))
