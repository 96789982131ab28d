"""The settings a RayDP Spark session starts with (``spark_configs``): our JVM flags, logs, event
log, parallelism, authentication and encryption, Hive's catalog for a query, and the user's
``cluster.spark_conf`` over them; and a warning for each user setting this Spark does not know."""

from __future__ import annotations

import logging
from pathlib import Path

from raydp_llm.core.config import ClusterSettings
from raydp_llm.engines.java import JVM_FLAGS, QUICK_START_FLAGS
from raydp_llm.engines.spark_security import SECRET, protection_settings, user_settings

log = logging.getLogger(__name__)

LOG4J_FILE = Path(__file__).resolve().parents[1] / "log4j2.properties"
EVENT_LOG_DIR = "spark-events"  # under the run directory

FETCH_MEMORY_KEY = "spark.ray.raydp_recoverable_fetch.task.resource.memory"


def fetch_task_memory(nodes: list[dict]) -> int:
    """Bytes of Ray's ``memory`` resource each ``from_spark`` fetch task reserves: a node's memory
    over twice its CPUs, so a node runs about two fetches per CPU at a time.

    Why: RayDP asks 0 CPU and 0 memory for them, and a fetch waits in ``ray.get`` on an executor
    (a waiting task gives its CPU back anyway), so Ray starts a Python worker for every partition
    at once: 150 processes for 90 chunks, RAM exhausted and the hand-off stuck. Memory, unlike CPU,
    stays reserved while a task waits."""
    shares = [
        node["Resources"]["memory"] / (2 * node["Resources"]["CPU"])
        for node in nodes
        if node.get("Alive") and node["Resources"].get("CPU") and node["Resources"].get("memory")
    ]
    return int(min(shares, default=0))


JAVA_OPTION_KEYS = frozenset({
    "spark.driver.extraJavaOptions",
    "spark.executor.extraJavaOptions",
    "spark.ray.raydp_app_master.extraJavaOptions",
})


def spark_configs(cfg: ClusterSettings, log_dir: Path, hive: bool = False,
                  jvm_flags: dict[str, list[str]] | None = None) -> dict[str, str]:
    """The Spark settings every session gets (and Hive's catalog with ``hive``), then
    ``cfg.spark_conf`` over them (its Java options follow ours in the same setting).
    ``jvm_flags``: more flags by Java options' key (``spark.driver.extraJavaOptions``: the class
    archives, the driver's Ray log directory)."""
    level = "info" if cfg.verbose else "warn"
    java_opts = " ".join(JVM_FLAGS + (QUICK_START_FLAGS if cfg.quick_jvm else []))
    flags = jvm_flags or {}
    configs = {key: " ".join([java_opts, *flags.get(key, [])]) for key in JAVA_OPTION_KEYS}
    configs["spark.driver.extraJavaOptions"] += f" -Draydp_llm.log.level={level}"
    configs |= {
        # The Spark driver's log4j2 file (RayDP passes it as -Dlog4j2.configurationFile).
        "spark.log4j.config.file.name": str(LOG4J_FILE),
        # Ray CPUs each executor actor reserves; below executor_cores leaves room for the Ray
        # tasks that run beside Spark (from_spark's fetch and Ray Data's metadata tasks).
        "spark.ray.raydp_spark_executor.actor.resource.cpu": str(cfg.executor_ray_cpus),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": str(bool(cfg.spark_ui)).lower(),
        # Spark's own per-task metrics, read back by spark_stats.py once Spark has stopped.
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": (log_dir / EVENT_LOG_DIR).resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": cfg.driver_memory,
        # Executors hold Spark's share of CPUs; Ray Train gets them back after the ETL.
        "spark.sql.shuffle.partitions": str(cfg.executors * cfg.executor_cores * 2),
        # one big text file still spreads over the executors
        "spark.sql.files.maxPartitionBytes": "16m",
        # Each executor's Python workers use its cores, not the machine's (tokenizers' thread pool).
        "spark.executorEnv.RAYON_NUM_THREADS": str(cfg.executor_cores),
        "spark.default.parallelism": str(cfg.executors * cfg.executor_cores * 2),
    }
    if cfg.scratch_dir:  # the driver's and executors' shuffle and spill files
        configs["spark.local.dir"] = f"{cfg.scratch_dir}/spark"
    if hive:
        configs |= hive_configs(cfg, log_dir, configs["spark.driver.extraJavaOptions"])
    # the secret is handed to the JVMs otherwise (spark_security.py): RayDP puts every setting on
    # its app master's command line
    user = {k: v for k, v in user_settings(cfg).items() if k != SECRET}
    configs |= protection_settings(user)  # authentication and encryption (spark_security.py)
    for key in JAVA_OPTION_KEYS & user.keys():  # added to ours: Spark on JDK 17 needs --add-opens
        user[key] = f"{configs[key]} {user[key]}"
    return configs | user


METASTORE_DIR = "metastore_db"  # under the run directory: an embedded cluster's Hive metastore
WAREHOUSE_DIR = "spark-warehouse"  # and its tables' files


def hive_configs(cfg: ClusterSettings, log_dir: Path, driver_java: str) -> dict[str, str]:
    """Hive's catalog for a ``data.query``. On the embedded cluster its metastore (Derby, and
    Derby's log) and its warehouse live in the run directory, never in the working directory;
    elsewhere (EMR) the cluster's metastore is the user's, set in ``cluster.spark_conf`` (Glue's
    client factory or ``spark.hadoop.hive.metastore.uris``: docs/configuration.md)."""
    configs = {"spark.sql.catalogImplementation": "hive"}
    if cfg.address != "local":
        return configs
    run_dir = log_dir.resolve()
    metastore = run_dir / METASTORE_DIR
    return configs | {
        "spark.sql.warehouse.dir": (run_dir / WAREHOUSE_DIR).as_uri(),
        "spark.hadoop.javax.jdo.option.ConnectionURL":
            f"jdbc:derby:;databaseName={metastore};create=true",
        # derby.log is written where derby.system.home points (the working directory otherwise)
        "spark.driver.extraJavaOptions": f"{driver_java} -Dderby.system.home={run_dir}",
    }


# Families of settings Spark reads by prefix (no fixed list of keys): they are never reported as
# unknown.
SPARK_PREFIXES = (
    "spark.ray.",
    "spark.executorEnv.",
    "spark.hadoop.",
    "spark.sql.catalog.",
    "spark.executor.resource.",
    "spark.driver.resource.",
    "spark.task.resource.",
    "spark.metrics.conf.",
    "spark.sql.hive.",
)


def warn_unknown_settings(spark, settings: dict) -> None:
    """One warning per ``cluster.spark_conf`` key that this Spark does not know (a misspelt key is
    passed on and does nothing): Spark's own registry of settings, ``ConfigEntry``, holds every core
    and SQL setting."""
    find = spark.sparkContext._jvm.org.apache.spark.internal.config.ConfigEntry.findEntry
    for key in map(str, settings):
        if key.startswith(SPARK_PREFIXES) or find(key) is not None:
            continue
        log.warning(
            "cluster.spark_conf: Spark %s has no setting %s, so it does nothing; check "
            "its spelling (https://spark.apache.org/docs/%s/configuration.html)",
            spark.version,
            key,
            spark.version,
        )
