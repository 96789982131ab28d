"""``train.best_by`` (training/driver/best.py): the order of a column, the refusal of a column no
checkpoint reports, Ray Train's checkpoint ranking, and the best of the kept checkpoints."""

from __future__ import annotations

import math

import pytest
from ray.train import Checkpoint

from helpers.configs import make_config
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.errors import InputError
from raydp_llm.training.driver.best import best_of, check, checkpoint_config, order


@pytest.mark.parametrize("column,want", [
    ("val_loss", "min"), ("val_ppl", "min"), ("val_bpc", "min"), ("val_loss_domain", "min"),
    ("task_wiki_word_perplexity", "min"), ("task_wiki_bits_per_byte", "min"),
    ("val_acc", "max"), ("task_arc_acc_norm", "max"), ("val_reward_accuracy", "max"),
])
def test_losses_rank_lower_and_scores_higher(column, want):
    assert order(column) == want


def test_a_column_no_checkpoint_reports_is_one_line():
    for column in ("val_loss", "val_acc", "train_loss", "val_loss_web", "task_mc_acc"):
        check(column, ["mc"], ["web", "domain"], None)  # accepted
    with pytest.raises(InputError, match=r"^train.best_by=val_los: not a column every "
                                         r"checkpoint reports; .*\(train.eval_tasks has none\)$"):
        check("val_los", [], [], None)
    with pytest.raises(InputError, match=r"task_mc_<metric>\)$"):
        check("task_arc_acc", ["mc"], [], None)  # arc is not among train.eval_tasks
    with pytest.raises(InputError, match="not a column"):
        check("step", [], [], None)  # not a figure
    with pytest.raises(InputError, match=r"^train.best_by=task_mc_acc: tasks are scored every "
                                         r"train.task_interval=8 steps, .*task_interval=null"):
        check("task_mc_acc", ["mc"], [], 8)


def test_the_command_line_checks_it_before_any_engine_starts(corpus_dir):
    check_inputs(make_config(f"data.path={corpus_dir}", "train.best_by=val_loss"))
    with pytest.raises(InputError, match="^train.best_by=task_x_acc: not a column"):
        check_inputs(make_config(f"data.path={corpus_dir}", "train.best_by=task_x_acc"))


def test_ray_train_ranks_the_checkpoints_by_it():
    plain = checkpoint_config(3, None)
    assert plain.num_to_keep == 3 and plain.checkpoint_score_attribute is None
    ranked = checkpoint_config(2, "val_acc")
    assert (ranked.num_to_keep, ranked.checkpoint_score_attribute,
            ranked.checkpoint_score_order) == (2, "val_acc", "max")
    assert checkpoint_config(1, "val_loss").checkpoint_score_order == "min"


def test_the_best_is_the_later_of_equals_and_never_a_non_finite_value(tmp_path):
    kept = [(Checkpoint(str(tmp_path / str(step))), {"step": step, "val_loss": loss,
                                                      "val_acc": acc})
            for step, loss, acc in [(10, 2.0, 0.3), (20, 1.5, 0.5), (30, math.nan, 0.5),
                                    (40, 1.7, 0.4)]]
    low = best_of(kept, "val_loss")
    assert (low.step, low.value, low.checkpoint.path) == (20, 1.5, str(tmp_path / "20"))
    high = best_of(kept, "val_acc")
    assert (high.step, high.value) == (30, 0.5)  # 20 and 30 tie: the later, as Ray Train ranks
    assert best_of(kept, None) is None and best_of(None, "val_loss") is None
    assert best_of(kept, "task_mc_acc") is None  # no checkpoint reported it
    assert high.summary("/run/best_model") == {
        "by": "val_acc", "order": "max", "step": 30, "value": 0.5,
        "checkpoint": str(tmp_path / "30"), "model": "/run/best_model"}
