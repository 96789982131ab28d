"""Directories that are complete or ignored: training checkpoints, model directories and ETL cache
entries.

A directory counts only when its marker ``complete.json`` exists and every file the marker lists has
the size (and, where recorded, the SHA-256) it lists. The marker is written after the files it
describes; a copy to S3 puts it last (``storage.publish``). A kill during a write or an upload, a
truncated or missing file, leaves a directory that ``problem`` names and every reader skips or
refuses, never one that is trained on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.fs as pafs

from raydp_llm.core import storage
from raydp_llm.core.storage import S3Options

MARKER = "complete.json"
CHUNK = 1 << 22  # bytes hashed at a time


def sha256_of(stream) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def seal(directory: Path, hashes: bool = True) -> Path:
    """Write ``directory/complete.json``: every file below ``directory`` with its size, and its
    SHA-256 when ``hashes`` (checkpoints and models: a few files; ETL cache entries list sizes only,
    their Parquet footers are checked on read)."""
    return write_marker(directory, listing(directory, hashes))


def listing(directory: Path, hashes: bool = True) -> dict[str, dict]:
    """Every file below ``directory`` (its relative path → its size, and SHA-256 with
    ``hashes``): what ``complete.json`` lists. A sharded checkpoint's marker lists every
    worker's files."""
    directory = Path(directory)
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MARKER):
        entry = {"bytes": path.stat().st_size}
        if hashes:
            with path.open("rb") as f:
                entry["sha256"] = sha256_of(f)
        files[path.relative_to(directory).as_posix()] = entry
    return files


def write_marker(directory: Path, files: dict[str, dict]) -> Path:
    marker = Path(directory) / MARKER
    marker.write_text(json.dumps({"files": dict(sorted(files.items()))}, indent=1))
    return marker


def problem(directory: str | Path, s3: S3Options = S3Options(), hashes: bool = True) -> str | None:
    """None when ``directory`` (local or S3) is complete; else what is wrong with it, in a few
    words."""
    fs, root = storage.resolve(directory, s3)
    try:
        with fs.open_input_stream(f"{root}/{MARKER}") as f:
            listed = json.loads(f.read())["files"]
    except FileNotFoundError:
        return f"no {MARKER}: it was never finished"
    except (OSError, ValueError, KeyError) as err:
        return f"its {MARKER} is unreadable ({type(err).__name__})"
    for name, want in listed.items():
        info = fs.get_file_info(f"{root}/{name}")
        if info.type != pafs.FileType.File:
            return f"{name} is missing"
        if info.size != want["bytes"]:
            return f"{name} has {info.size} bytes, {want['bytes']} were written"
        if hashes and "sha256" in want:
            with fs.open_input_stream(f"{root}/{name}") as f:
                if sha256_of(f) != want["sha256"]:
                    return f"{name} does not match its SHA-256"
    return None
