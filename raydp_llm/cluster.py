"""Cluster lifecycle: start (or join) Ray, start and stop Spark on it with RayDP.

``ray_session`` and ``spark_session`` are context managers, so Spark and Ray are stopped on
success, on error and on Ctrl-C alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import ray
import ray.data
from omegaconf import DictConfig
from ray.job_config import JobConfig

from raydp_llm.errors import InputError
from raydp_llm.java import JVM_FLAGS, ensure_java
from raydp_llm.monitoring import announce_dashboard

log = logging.getLogger(__name__)

NAMESPACE = "raydp_llm"
LOG4J_FILE = Path(__file__).with_name("log4j2.properties")
EVENT_LOG_DIR = "spark-events"  # under the run directory
USER_SPARK_LOCAL_IP = os.environ.get("SPARK_LOCAL_IP")


@contextlib.contextmanager
def ray_session(cfg: DictConfig, run_name: str) -> Iterator[None]:
    """Start an embedded Ray (``address: local``) or connect to ``address``; shut down on exit. The console
    gets the dashboard's URL and how to get in; the driver job carries ``run_name`` in its metadata.

    If Ray is already initialised in this process (tests, sweeps) it is reused and left running.
    """
    # Ray Data keeps row order (reading the ETL cache, handing over from Spark): runs are reproducible.
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    if ray.is_initialized():
        yield
        return
    secure_token_file()
    ensure_java()  # Ray starts the Java workers that host Spark executors: JAVA_HOME first.
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # Ray Train's run-state API: the dashboard's Train page and /api/train/v2/runs/v1 list the run.
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
    kwargs = dict(
        namespace=NAMESPACE,
        job_config=JobConfig(jvm_options=list(JVM_FLAGS),
                             metadata={"job_name": run_name, "raydp_llm_run": run_name}),  # the Jobs page's Name
        log_to_driver=bool(cfg.verbose),
        logging_level=logging.INFO if cfg.verbose else logging.ERROR,
    )
    if cfg.address == "local":
        kwargs.update(
            num_cpus=cfg.num_cpus,
            object_store_memory=cfg.object_store_mb * 1024 * 1024 if cfg.object_store_mb else None,
            include_dashboard=cfg.dashboard,
            dashboard_host=cfg.dashboard_host,
            dashboard_port=cfg.dashboard_port,
        )
    else:
        kwargs["address"] = cfg.address
    if not cfg.verbose:
        quiet_python_logs()
    context = ray.init(**kwargs)
    try:
        announce_dashboard(cfg, context.dashboard_url, context.address_info["gcs_address"])
        yield
    finally:
        ray.shutdown()


def secure_token_file(path: Path | None = None) -> None:
    """Ray 2.60 writes its token file ``~/.ray/auth_token`` with the umask's mode (0644: every user of the machine
    could read the token and reach the dashboard and the cluster). Create it 0600 before Ray would, or make one
    this user owns 0600."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    path = path or Path.home() / ".ray" / "auth_token"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            path.chmod(0o600)
            log.info("%s was readable by other users; it is 0600 now", path)
        return
    from ray._private.authentication.authentication_token_setup import generate_new_authentication_token

    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())


@contextlib.contextmanager
def spark_session(cfg: DictConfig, app_name: str, log_dir: Path) -> Iterator["pyspark.sql.SparkSession"]:  # noqa: F821
    """A RayDP Spark session with ``cfg.executors`` executors; always stopped on exit.

    Unless ``cfg.verbose``, the Spark driver JVM writes its stdout and stderr to ``log_dir/spark-driver.log``;
    Spark's event log goes to ``log_dir/spark-events/``.
    """
    import raydp

    level = "info" if cfg.verbose else "warn"
    java_opts = " ".join(JVM_FLAGS)
    configs = {
        # The Spark driver's log4j2 file (RayDP passes it as -Dlog4j2.configurationFile).
        "spark.log4j.config.file.name": str(LOG4J_FILE),
        "spark.driver.extraJavaOptions": f"{java_opts} -Draydp_llm.log.level={level}",
        "spark.executor.extraJavaOptions": java_opts,
        "spark.ray.raydp_app_master.extraJavaOptions": java_opts,
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
        "spark.sql.files.maxPartitionBytes": "16m",  # one big text file still spreads over the executors
        # Each executor's Python workers use its cores, not the machine's (tokenizers' thread pool).
        "spark.executorEnv.RAYON_NUM_THREADS": str(cfg.executor_cores),
        "spark.default.parallelism": str(cfg.executors * cfg.executor_cores * 2),
    }
    configs.update({str(k): str(v) for k, v in (cfg.spark_conf or {}).items()})
    ensure_java()
    (log_dir / EVENT_LOG_DIR).mkdir(parents=True, exist_ok=True)
    # The address Spark's driver (its RPC, block manager and web UI) listens on: the loopback on the embedded Ray
    # (every executor runs on this machine, and nothing else can reach the driver), else this node's address; a
    # SPARK_LOCAL_IP the user set wins. Spark's own authentication cannot guard it: RayDP 1.6.5's executors present
    # another application id than the driver's, and every broadcast fetch is then refused (docs/reliability.md).
    loopback = cfg.address == "local"
    os.environ["SPARK_LOCAL_IP"] = USER_SPARK_LOCAL_IP or ("127.0.0.1" if loopback else ray.util.get_node_ip_address())
    if loopback:  # RayDP would set the node's address
        configs.setdefault("spark.driver.host", "127.0.0.1")
        configs.setdefault("spark.driver.bindAddress", "127.0.0.1")
    # Executors run Python UDFs with this interpreter, not whatever `python3` is first on their PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not cfg.verbose:  # the Ray core worker inside the Spark driver JVM logs to stderr
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "warning")
    cpus_before = ray.available_resources().get("CPU", 0.0)
    placement = executor_placement_group(cfg)
    init = dict(app_name=app_name, num_executors=cfg.executors, executor_cores=cfg.executor_cores,
                executor_memory=cfg.executor_memory, fault_tolerant_mode=True,  # from_spark needs fault tolerance
                placement_group=placement, configs=configs)
    try:
        with contextlib.nullcontext() if cfg.verbose else _output_to(log_dir / "spark-driver.log"), \
                ThreadPoolExecutor(1) as pool:
            # Spark starts off the main thread so that PySpark installs no SIGINT handler: its handler calls
            # py4j from inside the handler, on the connection the interrupted call is using; py4j retries and
            # the KeyboardInterrupt is lost. Python's own handler stays, and the finally below stops Spark.
            # The driver JVM starts here and keeps the stdout and stderr it inherits.
            spark = pool.submit(raydp.init_spark, **init).result()
        spark.sparkContext.setLogLevel("INFO" if cfg.verbose else "WARN")
        if cfg.spark_ui:
            log.info("Spark UI: %s (while the ETL runs)", spark.sparkContext.uiWebUrl)
        _wait_for_executors(spark, cfg.executors)
        _start_python_workers(spark, cfg.executors * cfg.executor_cores)
        warn_unknown_settings(spark, cfg.spark_conf or {})
        yield spark
    finally:
        try:
            raydp.stop_spark()
        except Exception as err:  # an interrupted py4j call can leave the gateway unusable
            log.warning("Spark did not stop cleanly (%s); ending its driver JVM", type(err).__name__)
        _stop_driver_jvm()
        if placement is not None:
            ray.util.remove_placement_group(placement)
        _wait_for_cpus(cpus_before)


# Families of settings Spark reads by prefix (no fixed list of keys): they are never reported as unknown.
SPARK_PREFIXES = ("spark.ray.", "spark.executorEnv.", "spark.hadoop.", "spark.sql.catalog.", "spark.executor.resource.",
                  "spark.driver.resource.", "spark.task.resource.", "spark.metrics.conf.", "spark.sql.hive.")


def warn_unknown_settings(spark, settings: dict) -> None:
    """One warning per ``cluster.spark_conf`` key that this Spark does not know (a misspelt key is passed on and
    does nothing): Spark's own registry of settings, ``ConfigEntry``, holds every core and SQL setting."""
    find = spark.sparkContext._jvm.org.apache.spark.internal.config.ConfigEntry.findEntry
    for key in map(str, settings):
        if key.startswith(SPARK_PREFIXES) or find(key) is not None:
            continue
        log.warning("cluster.spark_conf: Spark %s has no setting %s, so it does nothing; check its spelling "
                    "(https://spark.apache.org/docs/%s/configuration.html)", spark.version, key, spark.version)


def executor_placement_group(cfg: DictConfig, timeout_s: float = 180.0):
    """With ``cluster.placement``: a placement group of one bundle per executor (its Ray CPUs and heap) placed by
    that strategy, for RayDP to start the executors in; None without."""
    if not cfg.placement:
        return None
    from raydp.utils import parse_memory_size

    bundle = {"CPU": cfg.executor_ray_cpus, "memory": parse_memory_size(cfg.executor_memory)}
    group = ray.util.placement_group([bundle] * cfg.executors, strategy=cfg.placement)
    if not group.wait(timeout_seconds=timeout_s):
        ray.util.remove_placement_group(group)
        raise InputError(f"cluster.placement={cfg.placement}: Ray could not place {cfg.executors} executors of "
                         f"{cfg.executor_ray_cpus:g} CPUs and {cfg.executor_memory} within {timeout_s:.0f}s; lower "
                         "cluster.executors or cluster.executor_memory, or add nodes")
    return group


def _wait_for_executors(spark, executors: int, timeout_s: float = 180.0) -> None:
    """Block until all executors have registered: RayDP returns before they have, and the first stage would
    run on whichever came first."""
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus  # the driver's block manager counts too
    deadline = time.monotonic() + timeout_s
    while status().size() - 1 < executors:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {status().size() - 1} of {executors} Spark executors registered within "
                               f"{timeout_s:.0f}s: the Ray cluster lacks CPUs or memory for them (see the Ray logs)")
        time.sleep(0.1)


def _start_python_workers(spark, slots: int) -> None:
    """Run one trivial Arrow task per task slot, so that the executors' Python workers (and the JVM code paths
    the ETL uses) are up before the first real job: start-up, not ETL time."""
    spark.range(0, slots, 1, slots).mapInArrow(lambda batches: (b.slice(0, 0) for b in batches), "id long").count()


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` for the duration: child processes started meanwhile (the Spark
    driver JVM) keep writing there, whether they log to stderr or print to stdout."""
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


def quiet_python_logs() -> None:
    """Silence Ray Data's and PySpark's deprecation chatter that RayDP triggers (nothing to act on)."""
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="DataFrame.sql_ctx is an internal property")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.data\.")  # Ray's own defaults


def _stop_driver_jvm() -> None:
    """End PySpark's gateway JVM, which outlives ``stop_spark`` and keeps using CPU and memory.

    The next Spark session in this process starts a fresh one.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    SparkContext._gateway = None
    SparkContext._jvm = None


def _wait_for_cpus(cpus: float, timeout_s: float = 60.0) -> None:
    """Wait until Ray has ``cpus`` CPUs free again: executor actors release theirs asynchronously."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < cpus and time.monotonic() < deadline:
        time.sleep(0.2)
