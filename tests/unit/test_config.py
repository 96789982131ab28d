"""Every config group option and every experiment composes and passes the input checks; every
setting says what it means, in ``--cfg job`` and ``--help``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from helpers.configs import compose_config, make_config
from helpers.paths import CONF_DIR, ROOT
from raydp_llm.cli.help import field_help
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.config import ClusterSettings, DataFormat, DataSettings
from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.model_config import uses_lora
from raydp_llm.core.schema import checks_of

GROUPS = {group: sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
          for group in ("data", "tokenizer", "model", "optim", "train", "cluster", "tracking")}
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


# model=hf needs model.path: tests/unit/test_pretrained.py composes it with a checkpoint
@pytest.mark.parametrize("group,option", [(g, o) for g, options in GROUPS.items() for o in options
                                          if (g, o) not in (("model", "hf"), ("model", "hf_lora"))])
def test_every_group_option_composes_and_checks(group, option):
    cfg = make_config(f"{group}={option}")
    assert check_inputs(cfg).files


@pytest.fixture(scope="module")
def real_window(hf_families, tmp_path_factory) -> Path:
    """The tiny Qwen2 with a real model's positions (2048, as Qwen2.5-0.5B's 32768 in spirit):
    RoPE has no table of positions, so only config.json changes."""
    directory = tmp_path_factory.mktemp("qwen2_long") / "qwen2"
    shutil.copytree(hf_families["qwen2"], directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 2048}))
    return directory


@pytest.fixture(scope="module")
def delta_table(tmp_path_factory) -> Path:
    """A Delta table of two rows (``+experiment=table``'s required ``data.table``)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    path = tmp_path_factory.mktemp("experiment_table") / "speeches"
    write_deltalake(path, pa.table({"text": ["To be, or not to be", "that is the question"]}))
    return path


@pytest.mark.parametrize("family", [None, "hf", "llama"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_checks_with_each_family(experiment, family, shakespeare,
                                                               real_window, delta_table):
    """Each experiment as shipped, and with model=hf (a tiny Qwen2 directory) or model=llama in
    place of its model: it composes, its settings hold for that family, and it passes the input
    checks once its required settings are given (refused until then)."""
    chosen = {None: [], "llama": ["model=llama"],
              "hf": ["model=hf", f"model.path={real_window}"]}[family]
    if (experiment.startswith("hf_") or experiment == "grpo") and family is None:
        chosen = [f"model.path={real_window}"]  # model=hf already: its directory
    if experiment == "grpo" and family == "llama":  # GRPO answers in a given tokenizer's ids
        chosen += [f"tokenizer.path={real_window}/tokenizer.json"]
    cfg = make_config(f"+experiment={experiment}", *chosen)
    assert cfg.name == experiment
    if family == "hf" and experiment not in ("chat", "smoke", "hf_sft_lora"):
        assert cfg.model.block_size == 1024  # the model's own window (up to 1024), not a toy's
    if family:
        assert cfg.model.kind == family and not uses_lora(cfg.model)  # no setting of another
    elif experiment in ("hf_sft_lora", "hf_dpo_lora"):
        assert cfg.model.lora.r == 16 and cfg.model.block_size == 1024
    given = {"data.path": str(shakespeare), "train.storage_path": "/tmp/raydp_llm_test_storage",
             "data.table": str(delta_table)}
    for i, key in enumerate(
        cfg.required
    ):  # settings it cannot run without: refused until each is given
        with pytest.raises(InputError, match=f"{key} is missing: the {experiment} configuration "
                                             "needs it"):
            check_inputs(
                make_config(
                    f"+experiment={experiment}", *chosen,
                    *(f"{k}={given[k]}" for k in cfg.required[:i])
                )
            )
    cfg = make_config(f"+experiment={experiment}", *chosen,
                      *(f"{k}={given[k]}" for k in cfg.required))
    corpus = check_inputs(cfg)  # a mixture's: one per source
    assert all(c.files for c in (corpus.values() if isinstance(corpus, dict) else [corpus]))


def keys(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items_ex(resolve=False):
        out.append(prefix + key)
        if isinstance(value, DictConfig) and key != "spark_conf":
            out += keys(value, f"{prefix}{key}.")
    return out


EVERY_OPTION = [("config", [f"{g}={o}"]) for g, opts in GROUPS.items() for o in opts]


@pytest.mark.parametrize("config_name,overrides", EVERY_OPTION + [("evaluate", [])])
def test_every_setting_has_a_meaning(config_name, overrides):
    docs = field_help()
    undocumented = [
        k for k in keys(compose_config(*overrides, config_name=config_name)) if not docs.get(k)
    ]
    assert not undocumented


def test_cfg_job_and_help_print_each_setting_with_its_meaning():
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "raydp_llm.train", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout

    cfg_job = cli("--cfg", "job", "model=lstm")
    assert "  n_embd: 256  # embedding width (lstm: also the hidden state size)\n" in cfg_job
    assert (
        "  val_fraction: 0.1  # fraction of tokens held out for validation, in (0, 1)\n" in cfg_job
    )
    help_text = cli("--help")
    assert "  n_head: 4  # attention heads per block; must divide n_embd\n" in help_text
    assert (
        "\nmodel: gpt, gpt2_small, gpt_mini, gpt_nano, gpt_tiny, hf, hf_lora, llama, llama_wide, "
        "lstm  # the language model"
        in help_text
    )
    assert "\ntokenizer: bpe, char  # char | bpe" in help_text  # not the schemas (base_char)
    assert "python -m raydp_llm.train -m +experiment=smoke" in help_text  # the examples


def test_a_choice_is_declared_once_for_its_help_and_its_check():
    help_text = field_help()["data.format"]
    assert help_text.startswith("text | ids (lines of whitespace-separated integer token ids) | ")
    assert checks_of(DataSettings)["format"].allowed == " | ".join(DataFormat.values())
    placement = checks_of(ClusterSettings)["placement"]
    assert placement.allowed == "null or PACK | SPREAD | STRICT_SPREAD"
    assert DataSettings().format == DataFormat.text == "text"  # a plain string, equal to the member


def test_first_line_is_the_first_non_blank_line_of_an_error_cut_to_its_limit():
    err = OSError("\n  no such key  \n  File ...")
    assert first_line(err) == "no such key"
    assert first_line(err, 6) == "no suc"
    assert first_line(err, 14, with_type=True) == "OSError: no su"
    assert first_line(ValueError()) == ""
