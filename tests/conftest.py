"""The tests' fixtures, registered by engine (tests/fixtures/: Ray, Spark, S3, MLflow, corpora,
torch, the launch scripts' stand-ins), and the ``integration`` marker. A test module imports
nothing from here: what tests share beside fixtures is in tests/helpers/."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = [
    "fixtures.s3",  # first: the fake AWS credentials, before any engine starts
    "fixtures.ray",
    "fixtures.spark",
    "fixtures.mlflow",
    "fixtures.corpora",
    "fixtures.torch",
    "fixtures.launch",
    "fixtures.two_nodes",  # test_multinode's cluster of two Ray nodes
    "fixtures.budget",  # the suite stops itself, with its report, before CI's limit
]


def pytest_collection_modifyitems(items):
    """Everything under tests/integration/ runs the real engines: ``-m "not integration"`` skips
    it."""
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
