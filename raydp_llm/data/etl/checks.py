"""The ETL's input checks, on what the scan found (UTF-16 text, binary files, invalid UTF-8, bad
JSON lines, a corpus of nothing but white space)."""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.data.etl.formats import reader_for
from raydp_llm.data.etl.records import EtlPlan, FileStats, Scanned
from raydp_llm.data.inputs.files import looks_binary, read_head, utf16, utf16_text

log = logging.getLogger(__name__)


def check_scanned(read: DataFrame, lines: DataFrame, files: dict[str, FileStats],
                  plan: EtlPlan) -> Scanned:
    """The inputs checked on what the scan found (``read``: the lines as read; ``lines``: as the
    later stages read them): the format's own checks, then ``check_files``; the binary files
    skipped (``data.skip_binary``) left out; one line for a corpus of nothing but whitespace."""
    corpus, data = plan.corpus, plan.data
    reader_for(data).check(read, files, data)
    skipped = check_files(files, data, plan.s3)
    if skipped:
        lines = lines.where(~F.col("src").isin(skipped))
        files = {k: v for k, v in files.items() if k not in skipped}
    if sum(f.nonblank for f in files.values()) == 0:
        raise InputError(f"data.path: the corpus {corpus.name} ({len(corpus.files)} files) holds "
                         "no text, only whitespace or nothing; point data.path at text files")
    return Scanned(lines, files, skipped)


def check_files(files: dict[str, FileStats], data: DataSettings, s3: S3Options) -> list[str]:
    """UTF-16 text, binary files and invalid UTF-8: errors, or the binary files to skip
    (``data.skip_binary``). A file with NUL bytes is looked at once more, on the driver: UTF-16 text
    has them too, and is named as such."""
    binary = sorted(src for src, f in files.items() if f.nul_lines)
    for src in binary:
        encoding = utf16(read_head(src, s3))
        if encoding:
            raise InputError(utf16_text(src, encoding))
    if binary and not data.skip_binary:
        more = f"; {len(binary) - 1} more such files" if len(binary) > 1 else ""
        raise InputError(looks_binary(binary[0], f"{files[binary[0]].nul_lines} lines{more}"))
    for src in binary:
        log.warning("skipping binary file %s (NUL bytes)", src)
    bad = sorted(src for src, f in files.items() if f.replaced and src not in binary)
    if bad and data.strict_utf8:
        raise InputError(f"{bad[0]} has {files[bad[0]].replaced} invalid UTF-8 sequences: fix "
                         "its encoding or set data.strict_utf8=false to replace them")
    return binary
