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


SQL_DOCS = 60  # the rows of sql_documents(): half of them English, half French


def sql_documents(n: int = SQL_DOCS):
    """A table of distinct documents (``id``, ``lang``, ``text``) for queries to select from."""
    import pyarrow as pa

    langs = ["en" if i % 2 else "fr" for i in range(n)]
    texts = [f"Document {i} in {lang}: the quick brown fox jumps over the lazy dog, {i * 7}."
             for i, lang in enumerate(langs)]
    return pa.table({"id": list(range(n)), "lang": langs, "text": texts})
