"""``python -m raydp_llm.evaluate``: the entry point in raydp_llm/cli/evaluate.py."""

from raydp_llm.cli.evaluate import cli

if __name__ == "__main__":
    cli()
