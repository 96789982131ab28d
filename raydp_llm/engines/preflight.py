"""Before the ETL, once Ray runs: does the job fit the cluster it reached? One line per misfit,
instead of Ray Train waiting forever for workers that cannot be placed, or files scattered over the
nodes' disks.

The CPU formula is the configuration's (``core.checks.cpus_needed``): the same one that checks the
embedded Ray before it starts.
"""

from __future__ import annotations

from pathlib import Path

import ray

from raydp_llm.core.checks import cpus_needed
from raydp_llm.core.config import ClusterSettings, TrainSettings
from raydp_llm.core.errors import InputError


def preflight(cluster: ClusterSettings, train: TrainSettings | None, store: Path | str | None
              ) -> None:
    """Check the running cluster: its CPUs for the job (the DDP workers only when ``train`` is
    given, as for a training run), each worker's fit on a node, checkpoint storage every node
    reaches, and a dataset directory (``store``) the executors share."""
    if train is not None:
        check_cpus(cluster, train)
        check_workers_fit(train)
        check_checkpoint_storage(train)
    if isinstance(store, Path):  # S3 (a str) is every node's
        check_store_is_shared(store)


def check_cpus(cluster: ClusterSettings, train: TrainSettings) -> None:
    # a Spark kept from an earlier job holds its CPUs through training
    need, formula = cpus_needed(cluster, train, cluster.keep_executors or cluster.keep_spark)
    have = ray.cluster_resources().get("CPU", 0)
    if need > have:
        kept = [f"cluster.{name}=false" for name in ("keep_executors", "keep_spark")
                if getattr(cluster, name)]
        fix = f"set {' and '.join(kept)} or lower them" if kept else "lower them"
        raise InputError(f"the Ray cluster has {have:g} CPUs but the job needs {need:g}: "
                         f"{formula}; {fix}")


def fits_beside_spark(cluster: ClusterSettings, train: TrainSettings) -> bool:
    """Whether the running cluster holds the DDP workers while Spark's executors hold theirs, and a
    CPU more: then Ray Train's worker group starts beside Spark and the ETL (training/driver/fit.py,
    ``started``), else once Spark has stopped (a group that cannot be placed would time out).
    The CPU more is for the Ray tasks that run beside Spark (from_spark's fetches, Ray Data's
    metadata tasks): the waiting workers hold theirs, and the hand-off must not wait for them."""
    need, _ = cpus_needed(cluster, train, kept=True)
    return ray.cluster_resources().get("CPU", 0) >= need + 1


def check_workers_fit(t: TrainSettings) -> None:
    """Every DDP worker (``train.cpus_per_worker`` CPUs, a GPU with ``train.use_gpu``) must fit on
    one of the running cluster's nodes, or Ray Train would wait for them forever."""
    need = {"CPU": t.cpus_per_worker} | ({"GPU": 1} if t.use_gpu else {})
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    fits = sum(min(int(node.get(k, 0) // v) for k, v in need.items()) for node in nodes)
    if fits < (t.min_workers or t.num_workers):
        have = ", ".join(f"{node.get('CPU', 0):g} CPUs/{node.get('GPU', 0):g} "
                         "GPUs" for node in nodes)
        gpu = " and 1 GPU" if t.use_gpu else ""
        raise InputError(f"train.num_workers={t.num_workers} workers of {t.cpus_per_worker:g} "
                         f"CPUs{gpu}: the Ray cluster's nodes ({have}) hold only {fits}; lower "
                         "train.num_workers or train.cpus_per_worker (cluster=emr: "
                         "cluster.worker_nodes, cluster.node_cpus), or add nodes")


def working_nodes() -> int:
    """The running cluster's live nodes with CPUs: those that run executors and DDP workers."""
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))


def check_store_is_shared(store: Path) -> None:
    """Spark's executors write the dataset's Parquet files where they run, and Ray Data's tasks read
    them where they run: on a cluster of several nodes a local directory would be scattered over the
    nodes' disks."""
    nodes = working_nodes()
    if nodes > 1:
        raise InputError(f"{store}: Spark's executors would write the dataset to this directory on "
                         f"each of the cluster's {nodes} nodes; on a cluster set "
                         "data.cache_dir=s3://bucket/prefix (or, for training, data.cache=false: "
                         "the windows then go from Spark to Ray directly)")


def check_checkpoint_storage(t: TrainSettings) -> None:
    """Ray Train's workers write checkpoints on their own nodes: on a cluster of several nodes they
    need storage every node reaches, which the default (the run directory) is not."""
    nodes = working_nodes()
    if nodes > 1 and not t.storage_path:
        raise InputError(f"train.storage_path is not set: on a cluster of {nodes} nodes the DDP "
                         "workers' checkpoints need storage every node reaches; set "
                         "train.storage_path=s3://bucket/prefix (or a shared filesystem's "
                         "mount)")
