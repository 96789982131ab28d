"""``python -m raydp_llm.generate model_dir=... prompt="..."``: sample text from a trained model, no
Ray or Spark.

Arguments are ``key=value``, the keys of ``GenerateSettings`` (raydp_llm/core/config.py; ``--help``
lists them with their meanings); values are taken verbatim (no YAML parsing, so a prompt needs no
quoting for Hydra); ``top_k=none`` samples from all tokens. ``model_dir`` may be on S3
(``s3://bucket/runs/<run>/model``).
"""

from __future__ import annotations

import dataclasses
import sys
import typing

from raydp_llm.cli.help import field_help
from raydp_llm.core.config import GenerateSettings, S3Settings
from raydp_llm.core.storage import S3Options
from raydp_llm.training.checkpoint import load_model_dir
from raydp_llm.training.sampling import sample_text, top_next_tokens

USAGE = "usage: python -m raydp_llm.generate model_dir=DIR [key=value ...] (--help: every key)"
NONE = ("none", "null")


class UsageError(ValueError):
    pass


def keys() -> dict[str, type]:
    """Every argument (``s3.*`` for the nested S3 settings) and the type its value converts to."""
    hints = typing.get_type_hints(GenerateSettings) | {f"s3.{k}": v for k, v in
                                                        typing.get_type_hints(S3Settings).items()}
    return {key: next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
            for key, hint in hints.items() if key != "s3"}


def parse_args(argv: list[str]) -> GenerateSettings:
    types, values, s3 = keys(), {}, {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in types:
            raise UsageError(f"unknown argument {arg!r}")
        try:
            converted = None if value.lower() in NONE and key != "prompt" else types[key](value)
        except ValueError:
            raise UsageError(f"{key}={value!r} is not a valid {types[key].__name__}") from None
        (s3 if key.startswith("s3.") else values)[key.removeprefix("s3.")] = converted
    settings = GenerateSettings(**values, s3=S3Settings(**s3))
    if settings.model_dir is None:
        raise UsageError("model_dir is required")
    return settings


def help_text() -> str:
    docs = field_help(GenerateSettings)
    defaults = dataclasses.asdict(GenerateSettings())
    lines = [f"  {key}={_shown(defaults, key)}  # {docs.get(key, '')}" for key in keys()]
    return "\n".join([USAGE, "", *lines])


def _shown(defaults: dict, key: str) -> str:
    value = defaults["s3"][key[3:]] if key.startswith("s3.") else defaults[key]
    if value is None:
        return "none"
    return repr(value) if key == "prompt" else str(value)


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(help_text())
        return 0
    try:
        s = parse_args(argv)
    except UsageError as err:
        print(f"{USAGE}: {err}", file=sys.stderr)
        return 2
    try:
        model, tokenizer = load_model_dir(s.model_dir, s3=S3Options.of(s.s3))
        text = sample_text(
            model, tokenizer, s.prompt, s.max_new_tokens, s.temperature, s.top_k, s.seed
        )
        top = top_next_tokens(model, tokenizer, s.prompt, s.show_top) if s.show_top > 0 else []
    # a missing model (FileNotFoundError), S3 out of reach, a bad prompt
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    if top:
        print(f"next-token top {len(top)} after the prompt:")
        for token, p in top:
            print(f"  {token!r}  {p:.4f}")
    return 0


def cli() -> None:
    """``python -m raydp_llm.generate`` and the ``raydp-llm-generate`` console script."""
    sys.exit(main(sys.argv[1:]))
