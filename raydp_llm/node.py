"""``python -m raydp_llm.node``: ``ray start`` with the project's Java, in raydp_llm/cli/node.py."""

from raydp_llm.cli.node import cli

if __name__ == "__main__":
    cli()
