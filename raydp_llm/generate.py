"""``python -m raydp_llm.generate``: the entry point in raydp_llm/cli/generate.py."""

from raydp_llm.cli.generate import cli

if __name__ == "__main__":
    cli()
