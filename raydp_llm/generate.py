"""``python -m raydp_llm.generate model_dir=... prompt="..."``: sample text from a trained model, no Ray or Spark.

Arguments are ``key=value``; the prompt is taken verbatim (no YAML parsing), ``top_k=none`` samples from all tokens.
"""

from __future__ import annotations

import sys

from raydp_llm.checkpoint import load_model_dir, sample_text

DEFAULTS = {"model_dir": None, "prompt": "\n", "max_new_tokens": 500, "temperature": 0.8, "top_k": 50, "seed": 1337}
TYPES = {"model_dir": str, "prompt": str, "max_new_tokens": int, "temperature": float, "top_k": int, "seed": int}


class UsageError(ValueError):
    pass


def parse_args(argv: list[str]) -> dict:
    args = dict(DEFAULTS)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in TYPES:
            raise UsageError(f"unknown argument {arg!r}")
        try:
            args[key] = None if key == "top_k" and value.lower() in ("none", "null", "0") else TYPES[key](value)
        except ValueError:
            raise UsageError(f"{key}={value!r} is not a valid {TYPES[key].__name__}") from None
    if args["model_dir"] is None:
        raise UsageError("model_dir is required")
    return args


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
    except UsageError as err:
        options = " ".join(f"{k}=" for k in DEFAULTS if k != "model_dir")
        print(f"usage: python -m raydp_llm.generate model_dir=DIR [{options}]: {err}", file=sys.stderr)
        return 2
    try:
        model, tokenizer = load_model_dir(args.pop("model_dir"))
        text = sample_text(model, tokenizer, **args)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
