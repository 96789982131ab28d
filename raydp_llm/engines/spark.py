"""Spark's lifecycle on Ray (RayDP): start the executors as Ray actors, stop them and the driver's
JVM on exit.

``spark_session`` is a context manager, so Spark is stopped on success, on error and on Ctrl-C
alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import ray

from raydp_llm.core.config import ClusterSettings
from raydp_llm.core.errors import InputError
from raydp_llm.engines.class_archive import ClassArchive
from raydp_llm.engines.java import ensure_java, remove_ray_java_library_copies
from raydp_llm.engines.raydp_fixes import (
    align_app_ids,
    gateway_without_preexec,
    ray_logs_flag,
    start_app_master,
)
from raydp_llm.engines.spark_security import SparkSecret, spark_secret
from raydp_llm.engines.spark_settings import (
    EVENT_LOG_DIR,
    FETCH_MEMORY_KEY,
    fetch_task_memory,
    spark_configs,
    warn_unknown_settings,
)
from raydp_llm.engines.spark_turns import spark_turn

log = logging.getLogger(__name__)

USER_SPARK_LOCAL_IP = os.environ.get("SPARK_LOCAL_IP")
INTERRUPTED_START_S = 60.0  # an interrupted Spark start ends within this, or its caller goes on


@dataclass
class _Kept:
    """The Spark a job of this process kept running (``cluster.keep_spark``) for the next."""

    settings: tuple  # what it was started with: the cluster settings and Hive's catalog or not
    session: "pyspark.sql.SparkSession"  # noqa: F821
    stop: contextlib.ExitStack  # closing it stops Spark


_kept: _Kept | None = None  # one Spark per process: PySpark has one SparkContext, RayDP one app


def _kept_as(cfg: ClusterSettings, hive: bool) -> tuple:
    """What a kept Spark must have been started with to serve a job: every cluster setting but
    how long Spark stays up."""
    return replace(cfg, keep_executors=False, keep_spark=False), hive


def kept_spark(cfg: ClusterSettings, hive: bool = False):
    """The Spark an earlier job of this process kept (``cluster.keep_spark``) if it was started with
    these settings and all its executors are still up; else None (a kept Spark with other
    settings, or one that lost an executor, is stopped)."""
    if _kept is None or hive:  # a query's catalog lives in its own run directory: never kept
        return None
    context = _kept.session.sparkContext
    try:
        healthy = not context._jsc.sc().isStopped() and _executors(context) >= cfg.executors
    except Exception:  # noqa: BLE001 - its driver JVM is gone: not healthy, whatever the error
        healthy = False
    if healthy and _kept.settings == _kept_as(cfg, hive):
        return _kept.session
    stop_kept_spark()
    return None


def stop_kept_spark() -> None:
    """Stop the Spark a job kept (``cluster.keep_spark``), if any: before another starts, and
    before Ray stops."""
    global _kept
    kept, _kept = _kept, None
    if kept is not None:
        log.info("stopping the Spark kept running (cluster.keep_spark)")
        kept.stop.close()


@contextlib.contextmanager
def spark_session(
    cfg: ClusterSettings, app_name: str, log_dir: Path, hive: bool = False
) -> Iterator["pyspark.sql.SparkSession"]:  # noqa: F821
    """A RayDP Spark session with ``cfg.executors`` executors, stopped on exit, unless
    ``cfg.keep_spark``: then the one an earlier job kept if it serves (``kept_spark``), else a
    new one kept running for the next job; it stops before another Spark starts, or when Ray
    stops.

    Unless ``cfg.verbose``, the Spark driver JVM writes its stdout and stderr to
    ``log_dir/spark-driver.log``; Spark's event log goes to ``log_dir/spark-events/``. With
    ``hive``, its catalog is Hive's (``hive_configs``: a ``data.query`` reads its tables).
    """
    global _kept
    keep = cfg.keep_spark and not hive  # a query's catalog lives in its own run directory
    kept = kept_spark(cfg, hive) if keep else None
    if kept is not None:
        yield kept
        return
    stop_kept_spark()
    if not keep:
        with _started_spark(cfg, app_name, log_dir, hive) as spark:
            yield spark
        return
    with contextlib.ExitStack() as starting:
        spark = starting.enter_context(_started_spark(cfg, app_name, log_dir, hive))
        _kept = _Kept(_kept_as(cfg, hive), spark, starting.pop_all())
    yield spark


@contextlib.contextmanager
def _started_spark(
    cfg: ClusterSettings, app_name: str, log_dir: Path, hive: bool
) -> Iterator["pyspark.sql.SparkSession"]:  # noqa: F821
    """``spark_session``'s Spark, started in its turn with a secret of its own; always stopped on
    exit."""
    with (spark_turn(), spark_secret(cfg) as secret,
          _spark_up(cfg, app_name, log_dir, hive, secret) as spark):
        yield spark


@contextlib.contextmanager
def _spark_up(
    cfg: ClusterSettings, app_name: str, log_dir: Path, hive: bool, secret: SparkSecret | None
) -> Iterator["pyspark.sql.SparkSession"]:  # noqa: F821
    java_home = ensure_java()
    archive, executors = driver_archive(cfg, java_home), executor_archive(cfg, java_home)
    configs = _session_configs(cfg, log_dir, hive, archive, executors, secret)
    _driver_environment(cfg, configs)
    placement = executor_placement_group(cfg)
    init = dict(
        app_name=app_name,
        num_executors=cfg.executors,
        executor_cores=cfg.executor_cores,
        executor_memory=cfg.executor_memory,
        fault_tolerant_mode=True,  # from_spark needs fault tolerance
        placement_group=placement,
        configs=configs,
    )
    registered = False
    try:
        spark = _init_spark(init, cfg.verbose, log_dir, secret)
        remove_ray_java_library_copies()  # the driver's and RayDP master's, loaded by now
        align_app_ids(spark)  # before the first job (raydp_fixes.py, 4)
        spark.sparkContext.setLogLevel("INFO" if cfg.verbose else "WARN")
        if cfg.spark_ui:
            log.info("Spark UI: %s (while the ETL runs)", spark.sparkContext.uiWebUrl)
        # Building the first DataFrame starts Spark SQL's session state in the driver (~2 s):
        # meanwhile the executors register.
        warm_up = _python_worker_job(spark, cfg.executors * cfg.executor_cores)
        _wait_for_executors(spark, cfg.executors)
        registered = True
        warm_up.collect()  # one job; count() would add a shuffle and a second job
        warn_unknown_settings(spark, cfg.spark_conf or {})
        yield spark
        if executors is not None:  # the session ended well: the executor has its classes loaded
            executors.dump_from(_executor_marker(), java_home)
    finally:
        # executors that never all registered are not waited for: the job is failing anyway
        _stop(cfg, placement, wait_for_cpus=registered, archive=archive)


def _session_configs(cfg: ClusterSettings, log_dir: Path, hive: bool,
                     archive: ClassArchive | None, executors: ClassArchive | None,
                     secret: SparkSecret | None) -> dict[str, str]:
    """The session's Spark settings (``spark_configs``) with the JVMs' class archives, the
    driver's Ray log directory and the application's ``secret`` (spark_security.py). RayDP's app
    master (its gateway JVM and its Java actor) maps the executors' archive: most of its classes
    are theirs (its CPU to start 9.3 → 6.7 s)."""
    jvm_flags = {"spark.driver.extraJavaOptions": [*(archive.flags() if archive else []),
                                                   ray_logs_flag()],
                 "spark.executor.extraJavaOptions": [],
                 "spark.ray.raydp_app_master.extraJavaOptions": []}
    if executors is not None:  # one look at the archive decides both: map it, or record one
        mapped = executors.mapping_flags()
        jvm_flags["spark.executor.extraJavaOptions"] = (
            mapped or executors.recording_flags(_executor_marker()))
        jvm_flags["spark.ray.raydp_app_master.extraJavaOptions"] = mapped
    if secret is not None:
        for key in ("spark.executor.extraJavaOptions",
                    "spark.ray.raydp_app_master.extraJavaOptions"):
            jvm_flags[key] = [*jvm_flags[key], *secret.java_flags()]
    configs = spark_configs(cfg, log_dir, hive, jvm_flags)
    configs.setdefault(FETCH_MEMORY_KEY, str(fetch_task_memory(ray.nodes())))
    (log_dir / EVENT_LOG_DIR).mkdir(parents=True, exist_ok=True)
    return configs


def _executor_marker() -> str:
    """A flag that tells this process's executor JVMs from any other's."""
    return f"-Draydp_llm.executor_of={os.getpid()}"


def _user_class_path(cfg: ClusterSettings) -> str:
    """The user's Spark settings that change a JVM's class path (``spark.jars``,
    ``spark.executor.extraClassPath``, ...): part of a class archive's key, since the JVM maps no
    archive written for another class path."""
    return " ".join(sorted(f"{k}={v}" for k, v in (cfg.spark_conf or {}).items()
                           if any(word in k.lower() for word in ("classpath", "jars", "packages"))))


def driver_archive(cfg: ClusterSettings, java_home: Path) -> ClassArchive | None:
    """With ``cluster.quick_jvm``, the driver JVM's class archive for this JDK and class path."""
    if not cfg.quick_jvm:
        return None
    return ClassArchive.for_driver(java_home, _user_class_path(cfg))


def executor_archive(cfg: ClusterSettings, java_home: Path) -> ClassArchive | None:
    """With ``cluster.quick_jvm`` on the embedded cluster (the executors run on this machine, where
    the archive is), the executors' class archive: their CPU to start 8.9 → 6.5 s on 2 cores."""
    if not cfg.quick_jvm or cfg.address != "local":
        return None
    return ClassArchive.for_executor(java_home, _user_class_path(cfg))


def _stop(cfg: ClusterSettings, placement, wait_for_cpus: bool,
          archive: ClassArchive | None = None) -> None:
    """Spark stopped, its driver JVM ended (the class ``archive`` it wrote sealed) and its
    placement group removed; with ``wait_for_cpus``, until Ray has the executors' CPUs back."""
    import raydp

    cpus_after = _cpus_without_executors(cfg) if wait_for_cpus else 0.0
    try:
        raydp.stop_spark()
    except Exception as err:  # an interrupted py4j call can leave the gateway unusable
        log.warning("Spark did not stop cleanly (%s); ending its driver "
                    "JVM", type(err).__name__)
    exit_code = _stop_driver_jvm()
    if archive is not None:
        archive.seal(exit_code)
    if placement is not None:
        ray.util.remove_placement_group(placement)
    _wait_for_cpus(cpus_after)


def _driver_environment(cfg: ClusterSettings, configs: dict[str, str]) -> None:
    """The address Spark's driver (its RPC, block manager and web UI) listens on: Ray's node
    address (the embedded Ray's: ``cluster.bind_address``, 127.0.0.1 by default); a
    SPARK_LOCAL_IP the user set wins. Also the executors' Python and the log level of the Ray core
    worker inside the driver JVM."""
    node_ip = ray.util.get_node_ip_address()
    os.environ["SPARK_LOCAL_IP"] = USER_SPARK_LOCAL_IP or node_ip
    if cfg.address == "local":  # the driver binds every address otherwise
        configs.setdefault("spark.driver.host", node_ip)
        configs.setdefault("spark.driver.bindAddress", node_ip)
    # Executors run Python UDFs with this interpreter, not whatever `python3` is first on their
    # PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not cfg.verbose:  # the Ray core worker inside the Spark driver JVM logs to stderr
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "warning")


def _init_spark(
    init: dict, verbose: bool, log_dir: Path, secret: SparkSecret | None
) -> "pyspark.sql.SparkSession":  # noqa: F821
    """``raydp.init_spark(**init)``, its driver JVM's output in ``log_dir`` unless ``verbose``, the
    application's ``secret`` handed to the driver's JVM."""
    import raydp

    quiet = contextlib.nullcontext() if verbose else _output_to(log_dir / "spark-driver.log")
    pool, started = ThreadPoolExecutor(2), None
    try:
        # the JVM launched with no Python run in the forked driver (raydp_fixes.py, 7)
        with quiet, gateway_without_preexec(), _driver_jvm_beside_master(pool, secret):
            # Spark starts off the main thread so that PySpark installs no SIGINT handler: its
            # handler calls py4j from inside the handler, on the connection the interrupted call
            # is using; py4j retries and the KeyboardInterrupt is lost. Python's own handler stays,
            # and the caller stops Spark. The driver JVM starts here and keeps the stdout and
            # stderr it inherits.
            started = pool.submit(raydp.init_spark, **init)
            return started.result()
    finally:
        # An interrupted start (Ctrl-C, a time-out) ends first, so that the caller stops all it
        # started; but not forever: its thread may be in a Ray call that never returns
        # (docs/reliability.md, 2026-12-02), and joining it hung the caller for good.
        if started is not None:
            wait([started], timeout=INTERRUPTED_START_S)
        pool.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def _driver_jvm_beside_master(pool: ThreadPoolExecutor,
                              secret: SparkSecret | None) -> Iterator[None]:
    """Launch the Spark driver's JVM while RayDP starts its app master, not after it.

    RayDP starts the app master (a Python actor, its gateway JVM, then a Java actor: ~5 s on 2
    cores) and only then creates the SparkContext, whose first step is launching the driver's JVM
    (~2 s). That JVM needs nothing from the master: it is launched in ``pool`` with the settings
    RayDP has prepared by then (class path, Java agent), and the SparkContext finds it running,
    the application's ``secret`` among its system properties.
    """
    from pyspark import SparkConf, SparkContext
    from raydp.spark.ray_cluster import SparkCluster

    set_up_master = SparkCluster._set_up_master

    def beside(self, resources, kwargs):
        conf = SparkConf(loadDefaults=False).setAll(self._configs.items())
        driver_jvm = pool.submit(SparkContext._ensure_initialized, conf=conf)
        try:
            start_app_master(self, resources)  # RayDP's own, with a timeout (raydp_fixes.py, 6)
        except BaseException:
            wait([driver_jvm])  # started or not, the JVM is known to PySpark: the caller stops it
            raise
        driver_jvm.result()  # a JVM that could not start raises PySpark's own error here
        if secret is not None:  # before the SparkContext
            secret.hand_to(SparkContext._jvm)

    SparkCluster._set_up_master = beside
    try:
        yield
    finally:
        SparkCluster._set_up_master = set_up_master


def executor_placement_group(cfg: ClusterSettings, timeout_s: float = 180.0):
    """With ``cluster.placement``: a placement group of one bundle per executor (its Ray CPUs and
    heap) placed by that strategy, for RayDP to start the executors in; None without."""
    if not cfg.placement:
        return None
    from raydp.utils import parse_memory_size

    bundle = {"CPU": cfg.executor_ray_cpus, "memory": parse_memory_size(cfg.executor_memory)}
    group = ray.util.placement_group([bundle] * cfg.executors, strategy=cfg.placement)
    if not group.wait(timeout_seconds=timeout_s):
        ray.util.remove_placement_group(group)
        raise InputError(f"cluster.placement={cfg.placement}: Ray could not place {cfg.executors} "
                         f"executors of {cfg.executor_ray_cpus:g} CPUs and {cfg.executor_memory} "
                         f"within {timeout_s:.0f}s; lower cluster.executors or "
                         "cluster.executor_memory, or add nodes")
    return group


def _wait_for_executors(spark, executors: int, timeout_s: float = 180.0) -> None:
    """Block until all executors have registered: RayDP returns before they have, and the first
    stage would run on whichever came first."""
    deadline, context = time.monotonic() + timeout_s, spark.sparkContext
    while _executors(context) < executors:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {_executors(context)} of {executors} Spark executors "
                               f"registered within {timeout_s:.0f}s: the Ray cluster lacks CPUs or "
                               "memory for them (see the Ray logs)")
        time.sleep(0.1)


def _executors(context) -> int:
    """The executors registered with the driver (its own block manager not counted)."""
    return context._jsc.sc().getExecutorMemoryStatus().size() - 1


def _python_worker_job(spark, slots: int) -> "pyspark.sql.DataFrame":  # noqa: F821
    """One trivial Arrow task per task slot: running it starts the executors' Python workers (and
    the JVM code paths the ETL uses) before the first real job: start-up, not ETL time."""
    return spark.range(0, slots, 1, slots).mapInArrow(
        lambda batches: (b.slice(0, 0) for b in batches), "id long"
    )


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` for the duration: child processes started
    meanwhile (the Spark driver JVM) keep writing there, whether they log to stderr or print to
    stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with path.open("ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def _stop_driver_jvm() -> int | None:
    """End PySpark's gateway JVM, which outlives ``stop_spark`` and keeps using CPU and memory;
    its exit code (None: there was none, or it had to be killed).

    The next Spark session in this process starts a fresh one.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return None
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    exit_code = None
    if proc is not None:
        proc.terminate()
        try:  # a JVM writing its class archive takes a second or two more
            exit_code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    SparkContext._gateway = None
    SparkContext._jvm = None
    return exit_code


def _cpus_without_executors(cfg: ClusterSettings) -> float:
    """The CPUs Ray will have free once the executors are gone: those free now and theirs. Counted
    from now, not from before Spark started: Ray Train's workers may have taken CPUs since (they
    start beside the ETL), and would never give them back to a wait for the earlier figure."""
    total = ray.cluster_resources().get("CPU", 0.0)
    free = ray.available_resources().get("CPU", 0.0)
    return min(total, free + cfg.executors * cfg.executor_ray_cpus)


def _wait_for_cpus(cpus: float, timeout_s: float = 60.0) -> None:
    """Wait until Ray has ``cpus`` CPUs free again: executor actors release theirs
    asynchronously."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < cpus and time.monotonic() < deadline:
        time.sleep(0.2)
