"""How a setting is declared: ``setting(default, help, check=...)`` gives a dataclass field its
meaning (for ``--help``) and the check its type cannot make; a ``Choice`` Enum holds the values a
setting may take, once, for both its help and its check. ``check_fields`` runs the checks.

Standard library only: the model group's schema (core/model_config.py) uses it, and the model file
runs with torch alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, Callable

from raydp_llm.core.errors import InputError


@dataclass(frozen=True)
class Check:
    """What a setting allows beyond its type: ``test`` passes the allowed values; ``allowed`` says
    which, for the error (``data.stride=0 is not allowed: use null or a number ≥ 1``)."""

    test: Callable[[Any], bool]
    allowed: str


class Choice(str, Enum):
    """The values a setting may take, each with an optional note for ``--help``::

        class DataFormat(Choice):
            text = "text"
            ids = "ids", "lines of whitespace-separated integer token ids"

    A ``str`` Enum: a member equals its value (``DataFormat.ids == "ids"``), so the settings keep
    plain strings and the code compares them with either."""

    def __new__(cls, value: str, note: str = "") -> Choice:
        member = str.__new__(cls, value)
        member._value_ = value
        member.note = note
        return member

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)

    @classmethod
    def listed(cls) -> str:
        """The values with their notes, for a help text: ``text | ids (lines of ...) | ...``."""
        return " | ".join(f"{m.value} ({m.note})" if m.note else m.value for m in cls)


def setting(default: Any, help: str, check: Check | None = None) -> Any:  # noqa: A002
    """A dataclass field with its meaning (and unit) for ``--help`` (the name Hydra users know), and
    the ``check`` its value must pass (``validate``); a ``Choice`` default is stored as its plain
    value."""
    metadata = {"help": help} if check is None else {"help": help, "check": check}
    if isinstance(default, Choice):
        default = default.value
    if isinstance(default, (dict, list)) or is_dataclass(default):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


# ------------------------------------------------------------------------------------- checks
def at_least(low: float) -> Check:
    return Check(lambda v: v >= low, f"a number ≥ {low}")


def above(low: float) -> Check:
    return Check(lambda v: v > low, f"a number > {low}")


def within(low: float, high: float) -> Check:
    return Check(lambda v: low <= v < high, f"a number in [{low}, {high})")


def optional(check: Check) -> Check:
    """``check``, or null (None)."""
    return Check(lambda v: v is None or check.test(v), f"null or {check.allowed}")


def one_of(choices: type[Choice]) -> Check:
    values = choices.values()
    return Check(lambda v: v in values, " | ".join(values))


POSITIVE = above(0)
COUNT = at_least(1)  # a count of at least one
OPTIONAL_COUNT = optional(COUNT)
FRACTION = Check(lambda v: 0 < v < 1, "a fraction strictly between 0 and 1")


def checks_of(schema: type) -> dict[str, Check]:
    """Field name → its check, for ``schema`` and the classes it extends: a subclass that only
    changes a default (``LSTMConfig.n_layer``) keeps its base class's check."""
    found: dict[str, Check] = {}
    for cls in schema.__mro__:
        if is_dataclass(cls):
            for f in fields(cls):
                if "check" in f.metadata:
                    found.setdefault(f.name, f.metadata["check"])
    return found


def check_fields(node: Any, prefix: str = "") -> None:
    """Raise ``InputError`` (key, bad value, what is allowed) for the first field of the dataclass
    ``node``, or of the dataclasses it holds, whose value fails its check."""
    checks = checks_of(type(node))
    for f in fields(node):
        value = getattr(node, f.name)
        check = checks.get(f.name)
        if check is not None and not check.test(value):
            raise InputError(f"{prefix}{f.name}={value} is not allowed: use {check.allowed}")
        if is_dataclass(value):
            check_fields(value, f"{prefix}{f.name}.")
        if isinstance(value, (list, tuple)):  # a list of settings (data.sources)
            for i, item in enumerate(value):
                if is_dataclass(item):
                    check_fields(item, f"{prefix}{f.name}.{i}.")
