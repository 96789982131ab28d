"""``python -m raydp_llm.train``: the entry point in raydp_llm/cli/train.py."""

from raydp_llm.cli.train import cli

if __name__ == "__main__":
    cli()
