"""``python -m raydp_llm.generate model_dir=... prompt="..."``: sample text from a trained model, no Ray or Spark."""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from raydp_llm.checkpoint import load_model_dir, sample_text

DEFAULTS = {"model_dir": None, "prompt": "\n", "max_new_tokens": 500, "temperature": 0.8, "top_k": 50, "seed": 1337}


def main(argv: list[str]) -> int:
    cfg = OmegaConf.merge(OmegaConf.create(DEFAULTS), OmegaConf.from_dotlist(argv))
    unknown = set(cfg) - set(DEFAULTS)
    if unknown or cfg.model_dir is None:
        print(f"usage: python -m raydp_llm.generate model_dir=DIR [{' '.join(f'{k}=' for k in DEFAULTS if k != 'model_dir')}]"
              + (f"; unknown keys: {', '.join(sorted(unknown))}" if unknown else ""), file=sys.stderr)
        return 2
    try:
        model, tokenizer = load_model_dir(cfg.model_dir)
        text = sample_text(model, tokenizer, str(cfg.prompt), cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.seed)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
