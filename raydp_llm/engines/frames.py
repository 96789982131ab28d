"""A Spark helper that the executors' code imports too (curation's classes): a leaf, so that an
executor's Python worker that unpickles them imports neither Ray nor RayDP (0.7 s a worker)."""

from __future__ import annotations


def detached(df):
    """``df`` cached under a short logical plan (its rows' RDD), for a result that later queries
    use several times. Spark prints a query's whole plan, a cached relation's plan within it, when
    it runs the query: chains of joins on cached results grow that text exponentially (the driver
    JVM ran out of heap on curation's stages). ``localCheckpoint`` would cut the plan too, but its
    blocks die with their executor; this keeps the lineage, so a lost executor's part is computed
    again."""
    from pyspark.sql import DataFrame

    session = df.sparkSession
    short = session._jsparkSession.createDataFrame(df._jdf.rdd(), df._jdf.schema())
    return DataFrame(short, session).cache()
