"""``python -m raydp_llm.generate model_dir=... prompt="..."``: sample text from a trained model, no
Ray or Spark; or, with ``data.path=PROMPTS out=DIR``, an answer to every row of a table of prompts
on Ray (cli/answers.py).

Arguments are ``key=value``, the keys of ``GenerateSettings`` (raydp_llm/core/config.py; ``--help``
lists them with their meanings); values are taken verbatim (no YAML parsing, so a prompt needs no
quoting for Hydra); ``top_k=none`` samples from all tokens. ``model_dir`` may be on S3
(``s3://bucket/runs/<run>/model``).
"""

from __future__ import annotations

import sys

from raydp_llm.cli.help import as_invoked
from raydp_llm.cli.keyvalue import UsageError, check_local_model_dir, help_text, parse_args
from raydp_llm.core.config import GenerateSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options

USAGE = as_invoked("usage: python -m raydp_llm.generate model_dir=DIR [key=value ...] (--help: "
                   "every key)")  # a console script says its own name


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(help_text(GenerateSettings, USAGE))
        return 0
    try:
        s = parse_args(GenerateSettings, argv, required=("model_dir",))
    except UsageError as err:
        print(f"{USAGE}: {err}", file=sys.stderr)
        return 2
    table = s.data.path or s.data.query
    if (s.data.path and s.data.query) or (table is None) != (s.out is None):
        print(f"{USAGE}: batch answers need the prompts (data.path, or data.query) and out "
              "(where the answers go)", file=sys.stderr)
        return 2
    try:
        check_local_model_dir(s.model_dir)
    except InputError as err:  # as evaluate says it, with its exit status
        print(f"error: {err}", file=sys.stderr)
        return 2
    if table is not None:
        return _answer_table(s)
    # torch: seconds to import, after the arguments are known good
    from raydp_llm.checkpoint.model_dir import load_model_dir

    try:
        model, tokenizer = load_model_dir(s.model_dir, s3=S3Options.of(s.s3))
        text, top = _generate(model, tokenizer, s)
    except FileNotFoundError as err:  # no model there (on S3): bad input, as evaluate says
        print(f"error: {err}", file=sys.stderr)
        return 2
    # S3 out of reach, a bad prompt
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    if top:
        print(f"next-token top {len(top)} after the prompt:")
        for token, p in top:
            print(f"  {token!r}  {p:.4f}")
    return 0


def _answer_table(s: GenerateSettings) -> int:
    """Batch answers (cli/answers.py): every prompt of ``data.path`` into ``out``."""
    from raydp_llm.cli.answers import answer_table

    try:
        done = answer_table(s)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{done['rows']:,} prompts in {done['parts']} parts; answered {done['answered']} "
          f"parts now; answers in {done['out']}")
    if done["appended"] is not None:
        print(f"appended to {s.output.table}: {done['appended']} groups of parts now (each answer "
              "once)")
    return 0


def _generate(model, tokenizer, s: GenerateSettings) -> tuple[str, list]:
    """The text (a chat reply with ``chat``), and the likeliest tokens after the prompt."""
    from raydp_llm.data.chat.template import model_template
    from raydp_llm.training.driver.generation import chat_reply, sample_text, top_next_tokens

    if s.chat:
        chat = model_template(s.model_dir, S3Options.of(s.s3))
        if chat is None:
            raise ValueError(f"model_dir={s.model_dir}: no chat template (chat_template.jinja or "
                             "tokenizer_config.json's chat_template); train it on chat data "
                             "(data.format=chat) or drop chat=true")
        text = chat_reply(model, tokenizer, chat, s, s.seed)
    else:
        text = sample_text(model, tokenizer, s.prompt, s.max_new_tokens, s.temperature, s.top_k,
                           s.seed)
    top = top_next_tokens(model, tokenizer, s.prompt, s.show_top) if s.show_top > 0 else []
    return text, top


def cli() -> None:
    """``python -m raydp_llm.generate`` and the ``raydp-llm-generate`` console script."""
    sys.exit(main(sys.argv[1:]))
