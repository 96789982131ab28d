"""``python -m raydp_llm.prepare``: the entry point in raydp_llm/cli/prepare.py."""

from raydp_llm.cli.prepare import cli

if __name__ == "__main__":
    cli()
