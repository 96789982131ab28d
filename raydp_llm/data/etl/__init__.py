"""The Spark ETL (``run.run_etl``), a module per stage; the records they hand one another in
``records.py``. Nothing is imported here: importing any submodule runs this file first, so a
submodule imported here would make a circle with every submodule that imports a sibling."""
