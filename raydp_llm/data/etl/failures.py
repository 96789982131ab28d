"""What fails in Spark's executors or its JVM, as the one line a user reads: an ``InputError`` an
executor raised, characters a given tokenizer lacks, an S3 object the executors could not read."""

from __future__ import annotations

import re

from raydp_llm.core.errors import InputError, RunFailure
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import UnknownCharacters


def input_error(err: Exception) -> InputError | None:
    """The one line an executor raised as an ``InputError`` (a chat row the template refuses, an
    overlong conversation with data.overlong=error...), or None."""
    message = raised_in_executor(err, InputError)
    return None if message is None else InputError(message)


def _text(err: Exception) -> str:
    """An executor's or the JVM's error as text; a Py4JJavaError asks the JVM, which may be gone."""
    try:
        return str(err)
    except Exception:  # noqa: BLE001 - any failure to describe it: no text to match
        return ""


def raised_in_executor(err: Exception, error: type[Exception]) -> str | None:
    """The message of an exception of type ``error`` that an executor's Python worker raised
    (PySpark hands the driver its traceback as text, which ends in the exception's qualified name),
    or None."""
    name = f"{error.__module__}.{error.__qualname__}"
    found = re.search(rf"^{re.escape(name)}: (.*)$", _text(err), re.MULTILINE)
    return found[1] if found else None


def unreadable_object(err: Exception, s3: S3Options) -> RunFailure | None:
    """The one-line error for an S3 object the executors could not read after ``s3.max_attempts``
    attempts (``s3_reader`` names the object), or None for any other failure."""
    found = re.search(r"^OSError: (s3://.*)$", _text(err), re.MULTILINE)
    if found is None:
        return None
    return RunFailure("data.path: the executors could not read from S3 after "
                      f"s3.max_attempts={s3.max_attempts} attempts: {found[1][:250]}; check the "
                      "object, the bucket and s3.endpoint_url, then run again")


def unknown_characters(err: Exception, tok) -> InputError | None:
    """The one-line error for a corpus with characters a given char tokenizer lacks
    (``UnknownCharacters`` in the executors: those of the first batch that failed), or None for any
    other failure."""
    message = raised_in_executor(err, UnknownCharacters)
    if message is None:
        return None
    chars = repr(UnknownCharacters.chars_in(message))
    chars = chars if len(chars) <= 60 else chars[:60] + "…"
    return InputError(f"data.path: the corpus has characters that tokenizer.path={tok.path} lacks, "
                      f"among them {chars}; remove them from the corpus or use a tokenizer (a "
                      "model) whose vocabulary has them")
