"""The errors whose message is the whole report (what, where, what to do): an entry point prints
them as one line (raydp_llm/cli/common.py) instead of a traceback."""

from __future__ import annotations


class OneLineError(Exception):
    """An error whose message is the whole report: what, where, what to do."""


class InputError(OneLineError, ValueError):
    """Bad input: a path, a corpus or a setting."""


class RunFailure(OneLineError):
    """A run that cannot go on or end well (it diverged; its outputs could not be copied); what it
    wrote stays."""


def first_line(err: BaseException | str, limit: int | None = None, with_type: bool = False) -> str:
    """An error made one line of another message: the first non-blank line of its message (or of
    the text ``err``), stripped, after its type name with ``with_type``, cut to ``limit``
    characters. Libraries' messages (pyarrow, boto, Spark, Ray) run to many lines."""
    text = err if isinstance(err, str) else str(err)
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if with_type:
        line = f"{type(err).__name__}: {line}"
    return line[:limit]
