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


@contextlib.contextmanager
def documented_output() -> Iterator[None]:
    """With ``--help`` or ``--cfg``, annotate what Hydra prints with each setting's help."""
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
        sys.stdout.write(annotate(without_schemas(printed.getvalue()), field_help(), package))
