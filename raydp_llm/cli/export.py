"""``python -m raydp_llm.export model_dir=... out=...``: a trained GPT as a Hugging Face GPT-2
directory (``GPT2LMHeadModel`` + a fast tokenizer, safetensors) that ``transformers`` loads offline
with no custom code; no Ray or Spark. ``model_dir`` may be on S3. A model GPT-2 cannot hold exactly
(the LSTM) is refused with one line and exit status 2: nothing is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from raydp_llm.cli.help import as_invoked
from raydp_llm.cli.keyvalue import UsageError, check_local_model_dir, help_text, parse_args
from raydp_llm.core import storage
from raydp_llm.core.config import ExportSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.models.files import NotExpressible

USAGE = as_invoked("usage: python -m raydp_llm.export model_dir=DIR out=DIR [key=value ...] "
                   "(--help: every key)")  # a console script says its own name
LOAD_HINT = """load it with:
  from transformers import AutoModelForCausalLM, AutoTokenizer
  model = AutoModelForCausalLM.from_pretrained("{out}")
  tokenizer = AutoTokenizer.from_pretrained("{out}")"""


def export(settings: ExportSettings) -> tuple[Path, bool]:
    """Write the GPT-2 directory ``settings.out`` (whole or absent: written under a temporary name,
    then renamed); returns it and whether it holds a tokenizer (an ids model has none)."""
    out = Path(settings.out).absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"out={out}: already exists and is not an empty directory; give a new "
                         "directory (nothing is overwritten)")
    # torch: seconds to import, after the arguments are known good
    from raydp_llm.checkpoint.model_dir import load_model_dir
    from raydp_llm.models.gpt2 import check_exportable, save_gpt2_dir

    model, tokenizer = load_model_dir(settings.model_dir, s3=S3Options.of(settings.s3))
    check_exportable(model)  # before anything is written
    text = tokenizer if tokenizer.kind != "ids" else None
    with storage.whole_or_absent(out) as tmp:  # an empty out, checked above, is replaced
        save_gpt2_dir(tmp, model, text)
    return out, text is not None


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(help_text(ExportSettings, USAGE))
        return 0
    try:
        settings = parse_args(ExportSettings, argv, required=("model_dir", "out"))
    except UsageError as err:
        print(f"{USAGE}: {err}", file=sys.stderr)
        return 2
    try:
        check_local_model_dir(settings.model_dir)
    except InputError as err:  # as evaluate says it, with its exit status
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        out, with_tokenizer = export(settings)
    except NotExpressible as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:  # no model there (on S3): bad input, as evaluate says
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:  # S3 out of reach, a damaged model dir
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out} (GPT2LMHeadModel, safetensors)")
    if not with_tokenizer:
        print("no tokenizer: the model reads token ids (data.format=ids), not text")
    print(LOAD_HINT.format(out=out))
    return 0


def cli() -> None:
    """``python -m raydp_llm.export`` and the ``raydp-llm-export`` console script."""
    sys.exit(main(sys.argv[1:]))
