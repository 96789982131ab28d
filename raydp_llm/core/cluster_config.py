"""The cluster group's schema (``cluster.*``): the embedded Ray or the cluster to join, and Spark
on it with RayDP (its executors, their placement, the JVMs' settings, the run's scratch). Apart
from the rest of the configuration (core/config.py, which re-exports it), as the data and model
groups are."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Dict, Optional

from raydp_llm.core.schema import (
    COUNT,
    OPTIONAL_COUNT,
    POSITIVE,
    Check,
    Choice,
    one_of,
    optional,
    setting,
)


class PlacementStrategy(Choice):
    PACK = "PACK"
    SPREAD = "SPREAD", "over the nodes, as far as possible"
    STRICT_SPREAD = "STRICT_SPREAD", "each on a node of its own"


def is_ip(address: str) -> bool:
    """Whether ``address`` is an IPv4 or IPv6 address."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ClusterSettings:
    address: str = setting("local", "local = start an embedded Ray; otherwise a Ray address "
                                    "(auto, ray://host:10001, host:6379)")
    num_cpus: Optional[int] = setting(None, "CPUs the embedded Ray may use; null = all",
                                      check=optional(POSITIVE))
    object_store_mb: Optional[int] = setting(1024, "embedded Ray object store size, MiB; null = "
                                                   "Ray's default")
    bind_address: str = setting("127.0.0.1", "the address the embedded Ray and Spark listen on: "
                                             "127.0.0.1 = this machine only; another address of "
                                             "this machine, or 0.0.0.0 for the one Ray picks, "
                                             "opens their ports to that network "
                                             "(docs/security.md)",
                                check=Check(is_ip, "an IP address of this machine, "
                                                                "e.g. 127.0.0.1 or 0.0.0.0"))
    dashboard: bool = setting(True, "start the Ray dashboard with the embedded Ray (token "
                                    "authentication on)")
    dashboard_host: str = setting("127.0.0.1", "address the embedded Ray's dashboard listens on; "
                                               "127.0.0.1 = this machine only (from elsewhere: an "
                                               "SSH tunnel)")
    dashboard_port: Optional[int] = setting(None, "the dashboard's port; null = 8265, or the next "
                                                  "free one",
                                            check=optional(Check(lambda v: 0 < v < 65536,
                                                                 "a port number, 1-65535")))
    scratch_dir: Optional[str] = setting(
        None, "a directory on each node's large volume for the run's scratch: Spark's local "
              "directories (shuffle, spill), the copies of s3:// models, and on the embedded Ray "
              "its session and spilled objects; null = /tmp and ~/.cache (on EMR "
              "launch/emr/bootstrap.sh sets these per node)",
        check=optional(Check(lambda v: v.startswith("/"), "an absolute local path")))
    spark_ui: bool = setting(False, "start Spark's web UI during the ETL and print its URL")
    verbose: bool = setting(False, "show Ray, Spark and Java logs on the console")
    # One executor of 2 slots rather than 2 of 1: the same parallelism, one JVM fewer to start
    # (the sample's first step ~7 s sooner on 2 cores). Clusters set one per node (cluster=emr).
    executors: int = setting(1, "Spark executors (Ray actors)", check=COUNT)
    executor_cores: int = setting(2, "Spark task slots per executor", check=COUNT)
    executor_ray_cpus: float = setting(
        0.5, "Ray CPUs each executor actor reserves (below executor_cores leaves Ray room beside "
             "Spark)",
        check=Check(lambda v: 0 < v <= 1 or v == int(v), "a number in (0, 1] or a whole number "
                                                         "(Ray's Java actors take no other "
                                                         "fractions)"))
    executor_memory: str = setting("1g", "JVM heap per executor")
    keep_executors: bool = setting(False, "keep Spark running through training (its Ray CPUs stay "
                                          "taken); false = stop it after the hand-off")
    keep_spark: bool = setting(False, "keep Spark up after the job for the next one in this "
                                      "process with these cluster settings (a sweep, the tests); "
                                      "its Ray CPUs stay taken until Ray stops")
    driver_memory: str = setting("1g", "Spark driver JVM heap")
    quick_jvm: bool = setting(True, "Spark's JVMs compile with C1 alone (-XX:TieredStopAtLevel=1) "
                                    "and its driver and executors map their classes from "
                                    "archives a first run writes (~/.cache/raydp_llm/jvm): "
                                    "ready sooner; false for hours-long ETLs on many cores")
    spark_conf: Dict[str, Any] = setting({}, "extra Spark settings, e.g. "
                                             "{spark.sql.shuffle.partitions: 8}")
    placement: Optional[str] = setting(
        None, "where Ray puts the Spark executors and the DDP workers: null = Ray's default | "
              f"{PlacementStrategy.listed()}", check=optional(one_of(PlacementStrategy)))
    worker_nodes: int = setting(1, "nodes that run executors and DDP workers; "
                                   "conf/cluster/emr.yaml sizes the job per node from it",
                                check=COUNT)
    node_cpus: Optional[int] = setting(None, "Ray CPUs of each such node (EMR: the instance's "
                                             "vCPUs - 1); conf/cluster/emr.yaml sizes the job per "
                                             "node from it", check=OPTIONAL_COUNT)
