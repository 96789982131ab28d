"""The Spark engine as the ETL starts it (Ray + RayDP Spark): the driver on the loopback only, C1
and the module flags on every JVM, the driver's JVM launched with no Python run in the fork of
this Ray driver, unknown Spark settings warned about."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_unknown_spark_settings_are_warned_about(spark, caplog):
    from raydp_llm.engines.spark_settings import warn_unknown_settings

    warn_unknown_settings(
        spark,
        {
            "spark.sql.shuffle.partitions": 4,
            "spark.sql.shufle.partitions": 4,
            "spark.executorEnv.FOO": "1",
            "spark.memory.fractio": 0.5,
        },
    )
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        len(warned) == 2
        and "has no setting spark.sql.shufle.partitions, so it does nothing" in warned[0]
    )
    assert "spark.memory.fractio" in warned[1]


def test_the_spark_driver_listens_on_the_loopback_only(spark):
    """On the embedded Ray every executor runs on this machine: the driver's RPC port refuses a
    client that comes from the machine's network address, and so from any other machine."""
    import socket

    import ray

    address = spark.sparkContext._jsc.sc().env().rpcEnv().address()
    assert address.host() == "127.0.0.1"
    with socket.create_connection(("127.0.0.1", address.port()), timeout=5):
        pass
    node_ip = ray.util.get_node_ip_address()
    if node_ip != "127.0.0.1":
        with pytest.raises(OSError):
            socket.create_connection((node_ip, address.port()), timeout=5).close()


def test_every_spark_jvm_starts_with_c1_and_the_module_flags(spark):
    """cluster.quick_jvm (on by default): the driver's and the executors' JVMs compile with C1 only,
    and keep the --add-opens flags that Spark needs on JDK 17."""

    def executor_jvm_command(_):  # nested: pickled by value for the executors' Python workers
        import os

        with open(f"/proc/{os.getppid()}/stat") as f:  # the worker's parent: pyspark's daemon
            jvm = int(f.read().rsplit(")", 1)[1].split()[1])  # the daemon's parent: the executor
        with open(f"/proc/{jvm}/cmdline", "rb") as f:
            return f.read().decode().split("\0")

    jvm = spark.sparkContext._jvm
    driver = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    executors = spark.sparkContext.parallelize(range(2), 2).map(executor_jvm_command).collect()
    assert all("io.ray.runtime.runner.worker.DefaultWorker" in args for args in executors)
    for args in [driver, *executors]:
        assert "-XX:TieredStopAtLevel=1" in args
        assert "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED" in args


def test_the_driver_jvm_was_launched_with_no_python_run_in_the_fork(spark):
    """raydp_fixes.py, 7: PySpark's own launch runs Python in the fork of this process, a Ray
    driver, and a garbage collection there acted on its Ray connections (the suite hung). Launched
    as the workaround launches it, the JVM has a process group of its own."""
    import os

    from pyspark import SparkContext

    jvm = SparkContext._gateway.proc.pid
    assert os.getpgid(jvm) == jvm != os.getpgid(0)
