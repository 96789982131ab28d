"""Corpus files written as the tests need them."""

from __future__ import annotations

from pathlib import Path


def write_lines(path: Path, lines: list[str]) -> None:
    """Lines to a file, compressed as its suffix says (.gz, .bz2, .zst: pyarrow's codecs)."""
    import pyarrow as pa

    data = "".join(line + "\n" for line in lines).encode()
    codec = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}.get(path.suffix)
    if codec is None:
        path.write_bytes(data)
        return
    with pa.CompressedOutputStream(str(path), codec) as out:
        out.write(data)

