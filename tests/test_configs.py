"""Every config group option and every experiment composes and passes the input checks."""

from __future__ import annotations

import pytest

from conftest import CONF_DIR, make_config
from raydp_llm.errors import InputError
from raydp_llm.pipeline import check_inputs

GROUPS = {group: sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
          for group in ("data", "tokenizer", "model", "optim", "train", "cluster")}
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g, options in GROUPS.items() for o in options])
def test_every_group_option_composes_and_checks(group, option):
    cfg = make_config(f"{group}={option}")
    assert check_inputs(cfg).files


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_checks(experiment, shakespeare):
    cfg = make_config(f"+experiment={experiment}")
    assert cfg.name == experiment
    if cfg.data.require_path:  # a corpus the project does not ship: refused without data.path
        with pytest.raises(InputError, match="data.path is missing"):
            check_inputs(cfg)
        cfg = make_config(f"+experiment={experiment}", f"data.path={shakespeare}")
    assert check_inputs(cfg).files
