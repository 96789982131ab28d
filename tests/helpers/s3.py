"""The local S3 stand-in (the ``s3`` fixture, tests/fixtures/s3.py): its bucket, and the fake
credentials the standard AWS chain finds first."""

from __future__ import annotations

import os

BUCKET = "raydp-llm-test"  # in the s3 fixture's server

# Where the standard AWS chain looks first; no instance metadata lookups.
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def use_fake_credentials() -> None:
    """``FAKE_AWS`` in this process's environment (a value already set is kept), so that every Ray,
    Spark or Ray Train worker started after this inherits it."""
    for key, value in FAKE_AWS.items():
        os.environ.setdefault(key, value)
