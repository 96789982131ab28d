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


def glue_catalog(s3, warehouse: str) -> dict:
    """pyiceberg's properties of a Glue catalog on the S3 stand-in (moto serves Glue too), its
    warehouse an s3:// prefix: what an EMR user gives as data.catalog, with the endpoints AWS
    needs none of (``s3``: the fixture's ``S3Options``)."""
    return {"name": "glue", "type": "glue", "glue.endpoint": s3.endpoint_url,
            "glue.region": "us-east-1", "s3.endpoint": s3.endpoint_url, "s3.region": "us-east-1",
            "warehouse": warehouse}
