"""``python -m raydp_llm.export``: the entry point in raydp_llm/cli/export.py."""

from raydp_llm.cli.export import cli

if __name__ == "__main__":
    cli()
