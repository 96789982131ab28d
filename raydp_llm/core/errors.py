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
