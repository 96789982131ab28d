"""``generate``'s and ``export``'s ``key=value`` arguments (cli/keyvalue.py): a boolean reads as
Hydra reads it for train's settings (issue 67: ``chat=false`` turned chat on)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf, ValidationError

from raydp_llm.cli.keyvalue import UsageError, convert, parse_args
from raydp_llm.core.config import GenerateSettings

SPELLINGS = ["false", "False", "FALSE", "0", "no", "off", "n", "true", "True", "1", "yes", "on",
             "y", "2", "-1"]


@dataclass
class _Flag:
    flag: bool = False


@pytest.mark.parametrize("value", SPELLINGS)
def test_a_boolean_reads_as_hydras_bool_setting_reads_it(value):
    """The reference: the same text merged into a structured config's bool, as Hydra merges a
    command line's ``flag=value`` into train's settings."""
    hydra = OmegaConf.merge(OmegaConf.structured(_Flag), {"flag": value}).flag
    assert convert(bool, value) is hydra


@pytest.mark.parametrize("value", ["maybe", "", "nope"])
def test_what_hydra_refuses_as_a_bool_is_refused(value):
    with pytest.raises(ValidationError):
        OmegaConf.merge(OmegaConf.structured(_Flag), {"flag": value})
    with pytest.raises(UsageError, match=f"chat={value!r} is not a valid bool"):
        parse_args(GenerateSettings, ["model_dir=m", f"chat={value}"], required=("model_dir",))


def test_chat_false_is_false_and_chat_true_is_true():
    args = ["model_dir=m", "prompt=hi"]
    assert parse_args(GenerateSettings, [*args, "chat=false"], ("model_dir",)).chat is False
    assert parse_args(GenerateSettings, [*args, "chat=0"], ("model_dir",)).chat is False
    assert parse_args(GenerateSettings, [*args, "chat=true"], ("model_dir",)).chat is True
    assert parse_args(GenerateSettings, args, ("model_dir",)).chat is False
