"""Shared fixtures: one embedded Ray for the whole session, configs composed with Hydra."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def make_config(*overrides: str):
    """The project's config with Hydra overrides, as the entry points see it."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    if not SHAKESPEARE.is_file():
        pytest.fail(f"benchmark corpus missing: {SHAKESPEARE} (the shared/ folder beside the checkout)")
    return SHAKESPEARE


@pytest.fixture(scope="session")
def ray_cluster():
    """An embedded Ray started once per test session (Spark is started per test on it)."""
    from raydp_llm.cluster import ray_session

    with ray_session(make_config().cluster):
        yield
