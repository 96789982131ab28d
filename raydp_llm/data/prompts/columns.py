"""The columns of a prompts file, read at the door from its first row (a local JSON Lines file) or
its schema (a local Parquet file), before any engine starts; None for what only Spark reads (S3,
compressed files, a query)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from raydp_llm.core.errors import InputError


def first_columns(path: str) -> set[str] | None:
    """The columns of ``path``'s rows, or None when they are not known before Spark reads it."""
    if "://" in path and not path.startswith("file://"):
        return None
    local = Path(path.removeprefix("file://"))
    if local.suffix.lower() == ".parquet":
        return set(pq.read_schema(local).names)
    if local.suffix.lower() not in (".jsonl", ".json", ".txt", ""):
        return None
    with local.open("rb") as f:
        for raw in f:
            if raw.strip():
                return _row_columns(raw, local)
    return None


def _row_columns(raw: bytes, path: Path) -> set[str]:
    try:
        row = json.loads(raw)
    except ValueError:
        raise InputError(f"{path}: line 1 is not JSON; data.format=prompts reads a JSON object "
                         "per line (or Parquet rows)") from None
    if not isinstance(row, dict):
        raise InputError(f"{path}: line 1 is not a JSON object; data.format=prompts reads one "
                         "per line, with a prompt column and the columns the rewards read")
    return set(row)
