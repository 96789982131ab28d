"""``key=value`` arguments for the commands that start no Spark (``generate``, ``export``): the
keys are a settings dataclass's fields (``s3.*``, ``data.*`` for its nested settings), each value
converted to its field's type; values are taken verbatim (no YAML parsing: a prompt needs no
quoting). A boolean reads as Hydra reads one for train's settings (OmegaConf's ``BooleanNode``:
``true``/``false``, ``yes``/``no``, ``on``/``off``, an integer): ``chat=false`` is False.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

from raydp_llm.cli.help import field_help
from raydp_llm.core.errors import InputError
from raydp_llm.core.schema import check_fields

NONE = ("none", "null")


class UsageError(ValueError):
    pass


def nested(schema: type) -> dict[str, type]:
    """The fields of ``schema`` that are settings of their own (``s3``, ``data``): their keys are
    ``<field>.<key>``."""
    hints = typing.get_type_hints(schema)
    return {k: t for k, t in hints.items() if dataclasses.is_dataclass(t)}


def keys(schema: type) -> dict[str, type]:
    """Every argument of ``schema`` and the type its value converts to."""
    hints, inner = typing.get_type_hints(schema), nested(schema)
    for name, sub in inner.items():
        hints |= {f"{name}.{k}": v for k, v in typing.get_type_hints(sub).items()}
    return {key: _kind(hint) for key, hint in hints.items() if key not in inner}


def _kind(hint) -> type:
    """What a setting's value converts to: its type without Optional; a dict setting's value is
    JSON (``output.catalog='{"type": "sql", ...}'``)."""
    if typing.get_origin(hint) is typing.Union:
        hint = next(t for t in typing.get_args(hint) if t is not type(None))
    return dict if typing.get_origin(hint) is dict or hint is dict else hint


def parse_args(schema: type, argv: list[str], required: tuple[str, ...], verbatim=("prompt",)):
    """``schema``'s settings from ``argv``; UsageError for an unknown key, a value that does not
    convert, or a ``required`` key left out. ``none`` is None except for the ``verbatim`` keys."""
    types, inner = keys(schema), nested(schema)
    values: dict = {name: {} for name in inner}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in types:
            raise UsageError(f"unknown argument {arg!r}")
        try:
            none = value.lower() in NONE and key not in verbatim
            converted = None if none else convert(types[key], value)
        except ValueError:
            raise UsageError(f"{key}={value!r} is not a valid {types[key].__name__}") from None
        outer, dot, rest = key.partition(".")
        if dot:
            values[outer][rest] = converted
        else:
            values[key] = converted
    settings = schema(**(values | {name: sub(**values[name]) for name, sub in inner.items()}))
    try:  # each setting's own check, as train's are checked (max_new_tokens=-5, top_k=0)
        check_fields(settings)
    except InputError as err:
        raise UsageError(str(err)) from None
    missing = [key for key in required if getattr(settings, key) is None]
    if missing:
        raise UsageError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")
    return settings


def check_local_model_dir(model_dir: str) -> None:
    """A local ``model_dir`` without a model's files: the same one line (InputError) ``evaluate``
    gives, before torch is imported; an s3:// one is read when loaded."""
    from raydp_llm.checkpoint.layout import check_model_files
    from raydp_llm.core import storage

    if not storage.is_s3(model_dir):
        check_model_files(Path(model_dir), model_dir)


def convert(kind: type, value: str):
    """``value`` as a ``kind``; ValueError when it is none. ``bool(value)`` would take "false" for
    True: a boolean is read by OmegaConf's own rule, as Hydra reads train's."""
    if kind is dict:
        found = json.loads(value)  # a JSONDecodeError is a ValueError
        if not isinstance(found, dict):
            raise ValueError(value)
        return found
    if kind is not bool:
        return kind(value)
    from omegaconf.nodes import BooleanNode

    return BooleanNode().validate_and_convert(value)  # its ValidationError is a ValueError


def help_text(schema: type, usage: str, verbatim=("prompt",)) -> str:
    """The usage line, then every key with its default and meaning."""
    docs = field_help(schema)
    defaults = dataclasses.asdict(schema())

    def shown(key: str) -> str:
        outer, dot, rest = key.partition(".")
        value = defaults[outer][rest] if dot else defaults[key]
        if value is None:
            return "none"
        return repr(value) if key in verbatim else str(value)

    lines = [f"  {key}={shown(key)}  # {docs.get(key, '')}" for key in keys(schema)]
    return "\n".join([usage, "", *lines])
