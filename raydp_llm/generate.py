"""``python -m raydp_llm.generate model_dir=... prompt="..."``: sample text from a trained model, no Ray or Spark.

Arguments are ``key=value``; the prompt is taken verbatim (no YAML parsing), ``top_k=none`` samples from all tokens,
``show_top=N`` also prints the N most likely tokens right after the prompt, with their probabilities. ``model_dir``
may be on S3 (``s3://bucket/runs/<run>/model``; ``s3.endpoint_url=`` and ``s3.region=`` as in the configuration).
"""

from __future__ import annotations

import sys

from raydp_llm.checkpoint import load_model_dir, sample_text, top_next_tokens
from raydp_llm.storage import S3Options

DEFAULTS = {"model_dir": None, "prompt": "\n", "max_new_tokens": 500, "temperature": 0.8, "top_k": 50, "seed": 1337,
            "show_top": 0, "s3.endpoint_url": None, "s3.region": None}
TYPES = {"model_dir": str, "prompt": str, "max_new_tokens": int, "temperature": float, "top_k": int, "seed": int,
         "show_top": int, "s3.endpoint_url": str, "s3.region": str}


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
        options = " ".join(f"[{k}={'TEXT' if k == 'prompt' else v}]" for k, v in DEFAULTS.items() if k != "model_dir")
        print(f"usage: python -m raydp_llm.generate model_dir=DIR {options}: {err}", file=sys.stderr)
        return 2
    try:
        s3 = S3Options(endpoint_url=args.pop("s3.endpoint_url"), region=args.pop("s3.region"))
        model, tokenizer = load_model_dir(args.pop("model_dir"), s3=s3)
        show_top = args.pop("show_top")
        text = sample_text(model, tokenizer, **args)
        top = top_next_tokens(model, tokenizer, args["prompt"], show_top) if show_top > 0 else []
    except (OSError, ValueError) as err:  # a missing model (FileNotFoundError), S3 out of reach, a bad prompt
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    if top:
        print(f"next-token top {len(top)} after the prompt:")
        for token, p in top:
            print(f"  {token!r}  {p:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
