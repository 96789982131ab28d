"""Where rows come from, a module per input kind: files (``data.path``: local, S3, compressed), a
Spark SQL query (``data.query``), a lakehouse table (``data.table``) and the tables that jobs append
their rows to (``output.table``)."""
