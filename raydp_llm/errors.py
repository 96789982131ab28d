"""Errors caused by the user's input, reported as one line (what, where, what to do) and exit code 1."""

from __future__ import annotations

import functools
import logging
import sys

log = logging.getLogger("raydp_llm")


class InputError(ValueError):
    """Bad input: a path, a corpus or a setting. The message is the whole report."""


def exit_on_input_error(main):
    """Wrap an entry point: an ``InputError`` becomes one logged line and exit status 1."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except InputError as err:
            log.error("error: %s", err)
            sys.exit(1)

    return wrapper
