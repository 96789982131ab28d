"""--help and --cfg with each setting's meaning: what Hydra prints, annotated from the schema's help
texts."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import sys
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Iterator

from raydp_llm.core.registry import SCHEMAS


def field_help(schema: type | None = None) -> dict[str, str]:
    """Dotted key → help for every field of ``schema``, or of every registered schema
    (``model.n_layer``, ...); one text per key, true for every option of its group."""
    docs: dict[str, str] = {}

    def walk(schema, prefix: str) -> None:
        hints = typing.get_type_hints(schema)
        for f in fields(schema):
            if "help" in f.metadata:
                docs.setdefault(prefix + f.name, f.metadata["help"])
            if f.default_factory is not dataclasses.MISSING and is_dataclass(f.default_factory()):
                walk(type(f.default_factory()), f"{prefix}{f.name}.")
            elif is_dataclass(hints.get(f.name)):  # a section a group fills (tracking)
                walk(hints[f.name], f"{prefix}{f.name}.")

    roots = [(None, schema)] if schema else [(group, root) for (group, _), root in SCHEMAS.items()]
    for group, root in roots:
        for cls in root.__mro__:  # a subclass's overridden default keeps its base class's help
            if is_dataclass(cls):
                walk(cls, f"{group}." if group else "")
    return docs


KEY_LINE = re.compile(r"^( *)([A-Za-z_][\w-]*):(.*)$")


def annotate(text: str, docs: dict[str, str], package: str = "") -> str:
    """YAML as OmegaConf prints it (2-space indents), with ``# help`` after each documented key;
    ``package``: the dotted path of the printed node (``--cfg job --package train``)."""
    out, path = [], [package] if package else []
    for line in text.splitlines():
        match = KEY_LINE.match(line)
        if match and "#" not in match.group(3):
            depth = len(match.group(1)) // 2 + (1 if package else 0)
            path = path[:depth] + [match.group(2)]
            doc = docs.get(".".join(path))
            if doc:
                line = f"{line}  # {doc}"
        out.append(line)
    return "\n".join(out) + "\n"


GROUP_LINE = re.compile(r"^([a-z_]+): ([\w, ]+)$")  # "model: base_gpt, gpt, ..." (--help's groups)


def without_schemas(text: str) -> str:
    """--help's group lines without the schemas' names (``base_gpt``): the conf/ files build on
    them; they are not options to pick."""
    schemas = {name for group, name in SCHEMAS if group}
    out, in_groups = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("== "):
            in_groups = line.startswith("== Configuration groups ==")
        match = GROUP_LINE.match(line.rstrip("\n"))
        if in_groups and match:
            options = [o for o in match.group(2).split(", ") if o not in schemas]
            line = f"{match.group(1)}: {', '.join(options)}\n"
        out.append(line)
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class Usage:
    """How ``--help`` opens for an entry point that shares train's config: its own usage line in
    place of train's, and the settings its ``own`` schema adds to train's, first."""

    line: str
    own: type | None = None
    examples: tuple[str, ...] = ()  # in place of train's (the footer's "Examples:")


def own_settings(schema: type) -> list[str]:
    """The settings ``schema`` adds to the one it extends, each with its default and meaning."""
    parent = schema.__mro__[1]
    base = {f.name for f in fields(parent)} if is_dataclass(parent) else set()
    return [f"  {f.name}={_shown(f)}  # {f.metadata['help']}"
            for f in fields(schema) if f.name not in base and "help" in f.metadata]


def _shown(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)  # as YAML writes them


GROUPS = "== Configuration groups =="


def opened_with(text: str, usage: Usage) -> str:
    """Hydra's help from its groups on, after ``usage``'s line and the entry point's own
    settings (train's header is train's usage)."""
    own = own_settings(usage.own) if usage.own else []
    title = f"== {usage.line.split()[2]}'s own settings =="
    opening = [usage.line, "", *([title, *own, ""] if own else [])]
    if GROUPS not in text:
        return text
    text = "\n".join(opening) + "\n" + text[text.find(GROUPS):]
    if usage.examples and EXAMPLES in text:
        text = text[:text.find(EXAMPLES)] + "\n".join([EXAMPLES, *usage.examples]) + "\n"
    return text


EXAMPLES = "Examples:"


def as_invoked(text: str) -> str:
    """``text`` with ``python -m raydp_llm.<entry>`` as the command was typed: a console script
    (``raydp-llm-train``) says its own name."""
    program = Path(sys.argv[0]).name
    if not program.startswith("raydp-llm-"):
        return text
    return text.replace(f"python -m raydp_llm.{program.removeprefix('raydp-llm-')}", program)


@contextlib.contextmanager
def documented_output(usage: Usage | None = None) -> Iterator[None]:
    """With ``--help`` or ``--cfg``, annotate what Hydra prints with each setting's help; with
    ``--help`` and a ``usage``, open with it."""
    args = sys.argv[1:]
    if not {"--help", "-h", "--cfg", "-c"} & set(args):
        yield
        return
    package = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--package", "-p")), "")
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        text = annotate(without_schemas(printed.getvalue()), field_help(), package)
        if usage is not None and {"--help", "-h"} & set(args):
            text = opened_with(text, usage)
        sys.stdout.write(as_invoked(text))
