"""Configs composed with Hydra from ``conf/``, as an entry point gets them: the composed config
(``compose_config``) and the typed settings made of it at the entry point's door
(``make_config``). Tests never touch the user's ETL cache: ``CACHE_DIR`` is a temp dir."""

from __future__ import annotations

import tempfile

from hydra import compose, initialize_config_dir

from helpers.paths import CONF_DIR
from raydp_llm.cli.inputs import typed_settings
from raydp_llm.core.registry import register_configs

register_configs()  # the schemas every composed config (compose_config) stands on

CACHE_DIR = tempfile.mkdtemp(prefix="raydp_llm_test_cache_")

# The contamination check costs about 5 s an ETL: the tests of other things leave it off (the
# curated ETL tests and the two-node run keep it).
NO_CHECK = "data.decontaminate=off"
# Spark's start costs about 10 s: the tests' in-process jobs keep Spark running for the next one
# with the same cluster settings (the tests of Spark's own start and stop set it false).
KEEP_SPARK = "cluster.keep_spark=true"
# The sample after training (600 tokens by default) is a second of the driver's CPU for a tiny GPT,
# several for a transformers model: the tests' runs write a short one unless they set it (or an
# experiment does).
SHORT_SAMPLE = "sample.max_new_tokens=40"


def compose_config(*overrides: str, config_name: str = "config"):
    """An entry point's composed config (``config``, ``evaluate``) with Hydra overrides (ETL cache
    in a temp dir), as Hydra hands it to the entry point."""
    if not any(o.startswith("data.cache_dir=") for o in overrides):
        overrides = (f"data.cache_dir={CACHE_DIR}", *overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def make_config(*overrides: str, config_name: str = "config"):
    """The typed settings an entry point makes of that config at its door
    (``cli.inputs.typed_settings``), the contamination check off, Spark kept between jobs and a
    short sample unless an override sets them (an experiment: its sample)."""
    defaults = [NO_CHECK, KEEP_SPARK]
    if not any(o.startswith("+experiment=") for o in overrides):
        defaults.append(SHORT_SAMPLE)
    for default in defaults:
        key = default.split("=")[0] + "="
        if not any(o.startswith(key) for o in overrides):
            overrides = (default, *overrides)
    return typed_settings(compose_config(*overrides, config_name=config_name), overrides)
