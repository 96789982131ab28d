"""``key=value`` arguments for the commands that start no engine (``generate``, ``export``): the
keys are a settings dataclass's fields (``s3.*`` for its nested S3 settings), each value converted
to its field's type; values are taken verbatim (no YAML parsing, so a prompt needs no quoting).
"""

from __future__ import annotations

import dataclasses
import typing

from raydp_llm.cli.help import field_help
from raydp_llm.core.config import S3Settings

NONE = ("none", "null")


class UsageError(ValueError):
    pass


def keys(schema: type) -> dict[str, type]:
    """Every argument of ``schema`` and the type its value converts to."""
    hints = typing.get_type_hints(schema)
    if "s3" in hints:
        hints |= {f"s3.{k}": v for k, v in typing.get_type_hints(S3Settings).items()}
    return {key: next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
            for key, hint in hints.items() if key != "s3"}


def parse_args(schema: type, argv: list[str], required: tuple[str, ...], verbatim=("prompt",)):
    """``schema``'s settings from ``argv``; UsageError for an unknown key, a value that does not
    convert, or a ``required`` key left out. ``none`` is None except for the ``verbatim`` keys."""
    types, values, s3 = keys(schema), {}, {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in types:
            raise UsageError(f"unknown argument {arg!r}")
        try:
            none = value.lower() in NONE and key not in verbatim
            converted = None if none else types[key](value)
        except ValueError:
            raise UsageError(f"{key}={value!r} is not a valid {types[key].__name__}") from None
        (s3 if key.startswith("s3.") else values)[key.removeprefix("s3.")] = converted
    settings = schema(**values, s3=S3Settings(**s3))
    missing = [key for key in required if getattr(settings, key) is None]
    if missing:
        raise UsageError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")
    return settings


def help_text(schema: type, usage: str, verbatim=("prompt",)) -> str:
    """The usage line, then every key with its default and meaning."""
    docs = field_help(schema)
    defaults = dataclasses.asdict(schema())

    def shown(key: str) -> str:
        value = defaults["s3"][key[3:]] if key.startswith("s3.") else defaults[key]
        if value is None:
            return "none"
        return repr(value) if key in verbatim else str(value)

    lines = [f"  {key}={shown(key)}  # {docs.get(key, '')}" for key in keys(schema)]
    return "\n".join([usage, "", *lines])
