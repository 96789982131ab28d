"""What the tests share that is not a fixture, imported as ``from helpers.<module> import ...``
(``tests/`` is on ``sys.path``: ``pythonpath`` in pyproject.toml's pytest settings). A test module
imports from here and from raydp_llm, never from ``conftest`` or another test module.

- ``paths``: the checkout's folders and the benchmark corpus
- ``configs``: configs composed with Hydra as an entry point gets them (``make_config``)
- ``s3``: the local S3 stand-in's bucket and fake credentials; ``flaky_s3``: an endpoint that flaps
- ``corpora``: corpus files written as tests need them
- ``chunks``: the ETL's chunk rows without Spark, for the unit tests of the data package
- ``etl``: the ETL step for a test, and readers of what it stored
- ``tiny_loop``: the worker's loop in plain torch on a tiny in-memory corpus
- ``hf_models``: tiny Hugging Face checkpoints built locally
- ``terminal``: an entry point started as from a terminal, and waiting for what it prints
- ``launch``: the launch scripts run with stand-ins for ``aws``, ``ssh`` and ``ray``
- ``two_node_cluster``: the two-node Ray cluster process of ``test_multinode``

Fixtures live in ``tests/fixtures/``, one module per engine, registered by ``tests/conftest.py``.
"""
