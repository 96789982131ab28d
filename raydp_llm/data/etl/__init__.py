"""The Spark ETL: ``run.run_etl`` runs the stages in order (``read``, ``scan`` and ``checks``,
``curation/``, ``tokenizer``, ``encode`` and ``chat_encode``, ``chunks``, ``manifest``; a reader per
``data.format`` in ``formats``, ``data.query``'s rows in ``query``), the records they hand one
another live in ``records``, and ``handoff`` writes the chunks as a cache entry or hands them to
Ray. Nothing is imported here: importing any submodule runs this file first, so a submodule
imported here would make a circle with every submodule that imports a sibling."""
