"""A Spark application on a Ray cluster, held open for tests/integration/test_multinode.py to knock
on its ports: ``python tests/helpers/spark_probe.py ADDRESS EXECUTORS``.

It starts Spark as a job does (``spark_session``: EXECUTORS executors of 1 core, each on a node of
its own, the application's secret), then prints one JSON line, ``{"driver": [host, block port],
"executors": [[host, block port], ...]}``, and answers commands on stdin:

- ``probe HOST PORT right|wrong``: Spark's own client (a ``TransportContext`` with an
  ``AuthClientBootstrap``, made in this driver's JVM with a configuration of its own) connects to
  HOST:PORT with the application's secret or with another one; prints ``connected`` or
  ``refused: <why>``.
- ``stop``, or the end of stdin: stop Spark and exit.
"""

from __future__ import annotations

import json
import secrets
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.configs import make_config  # noqa: E402
from raydp_llm.engines.ray_cluster import ray_session  # noqa: E402
from raydp_llm.engines.spark import spark_session  # noqa: E402
from raydp_llm.engines.spark_security import SECRET  # noqa: E402


def connect(spark, host: str, port: int, secret: str) -> str:
    """Spark's client, authenticating with ``secret``, connecting to ``host:port``."""
    jvm = spark._jvm
    conf = jvm.org.apache.spark.SparkConf(False)
    for key, value in {"spark.authenticate": "true", SECRET: secret,
                       "spark.network.crypto.enabled": "true"}.items():
        conf.set(key, value)
    none = jvm.scala.Option.empty()
    transport = jvm.org.apache.spark.network.netty.SparkTransportConf.fromSparkConf(
        conf, "shuffle", 1, none)
    settings = jvm.java.lang.Class.forName("org.apache.spark.internal.config.package$")
    secret_file = settings.getField("MODULE$").get(None).AUTH_SECRET_FILE()  # Scala's default
    manager = jvm.org.apache.spark.SecurityManager(conf, none, secret_file)
    bootstraps = jvm.java.util.ArrayList()
    bootstraps.add(jvm.org.apache.spark.network.crypto.AuthClientBootstrap(
        transport, "probe", manager))
    context = jvm.org.apache.spark.network.TransportContext(
        transport, jvm.org.apache.spark.network.server.NoOpRpcHandler())
    factory = context.createClientFactory(bootstraps)
    try:
        factory.createClient(host, port).close()
        return "connected"
    except Exception as err:  # noqa: BLE001 - py4j's wrapping of the JVM's refusal
        refusal = getattr(err, "java_exception", err)
        return "refused: " + str(refusal.toString() if refusal is not err else err)[:300]
    finally:
        factory.close()


def main(address: str, executors: int) -> None:
    cfg = make_config(f"cluster.address={address}", f"cluster.executors={executors}",
                      "cluster.executor_cores=1", "cluster.executor_ray_cpus=1",
                      "cluster.placement=STRICT_SPREAD", "cluster.keep_spark=false").cluster
    log_dir = Path(tempfile.mkdtemp(prefix="spark_probe_"))
    with ray_session(cfg, "spark-probe"), spark_session(cfg, "spark-probe", log_dir) as spark:
        context = spark.sparkContext._jsc.sc()
        secret = context.conf().get(SECRET)
        driver = context.env().blockManager().blockManagerId()
        managers = context.getExecutorMemoryStatus().keys().mkString(",").split(",")
        executors = [key.rsplit(":", 1) for key in managers]
        print(json.dumps({"driver": [driver.host(), driver.port()],
                          "executors": [[host, int(port)] for host, port in executors
                                        if [host, int(port)] != [driver.host(), driver.port()]]}),
              flush=True)
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["probe"]:
                key = secret if words[3] == "right" else secrets.token_hex(32)
                print(connect(spark, words[1], int(words[2]), key), flush=True)
            elif words[:1] == ["stop"]:
                break


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
