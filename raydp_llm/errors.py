"""How entry points end on bad input (one line: what, where, what to do; exit 1) and on Ctrl-C (exit 130)."""

from __future__ import annotations

import functools
import logging
import sys

log = logging.getLogger("raydp_llm")


class InputError(ValueError):
    """Bad input: a path, a corpus or a setting. The message is the whole report."""


def cli_errors(main):
    """Wrap an entry point: an ``InputError`` becomes one logged line and exit status 1; Ctrl-C exit 130.

    Spark and Ray are already stopped by then: their context managers end on any exception.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except InputError as err:
            log.error("error: %s", err)
            sys.exit(1)
        except KeyboardInterrupt:
            log.error("interrupted: Spark and Ray are stopped")
            sys.exit(130)

    return wrapper
