"""Ray's lifecycle: start an embedded Ray (or join one) for the run, and stop it on success, error
and Ctrl-C.

``ray_session`` is a context manager; the token file Ray 2.60 writes is made private before Ray
starts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import secrets
import time
import warnings
from pathlib import Path
from typing import Iterator

import psutil
import ray
import ray.data
from ray.job_config import JobConfig

from raydp_llm.core.config import ClusterSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.timing import Span
from raydp_llm.engines import raydp_fixes
from raydp_llm.engines.dashboard import announce_dashboard
from raydp_llm.engines.java import JVM_FLAGS, ensure_java
from raydp_llm.engines.spark import stop_kept_spark
from raydp_llm.models.files import MODEL_CACHE_ENV

log = logging.getLogger(__name__)

NAMESPACE = "raydp_llm"


@contextlib.contextmanager
def ray_session(cfg: ClusterSettings, run_name: str, waiting_cpus: float = 0,
                namespace: str = NAMESPACE) -> Iterator[Span]:
    """Start an embedded Ray (``address: local``) or connect to ``address``; shut down on exit.
    Yields when Ray's start began and when it was up. The console gets the dashboard's URL and how
    to get in; the driver job carries ``run_name`` in its metadata. An embedded Ray counts
    ``waiting_cpus`` on top of the machine's cores (``embedded_cpus``) unless ``cluster.num_cpus``
    says how many. Named actors live in ``namespace`` (a sweep's own: ``sweep_namespace``).

    If Ray is already initialised in this process (tests, sweeps) it is reused and left running.
    """
    # Ray Data keeps row order (reading the ETL cache, handing over from Spark): runs are
    # reproducible.
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    if ray.is_initialized():
        yield Span(time.time(), time.time())
        return
    began = time.time()
    secure_token_file()
    ensure_java()  # Ray starts the Java workers that host Spark executors: JAVA_HOME first.
    set_ray_environment(cfg)
    os.environ.update(scratch_environment(cfg))  # before Ray starts: its processes inherit it
    kwargs = init_options(cfg, run_name, waiting_cpus) | {"namespace": namespace}
    if cfg.address == "local":  # a killed run's agents, before this Ray's (raydp_fixes.py, 3)
        raydp_fixes.reap_orphaned_agents()
    if not cfg.verbose:
        quiet_python_logs()
    with node_address(cfg):  # Ray's processes, started now, keep it; this one's children do not
        context = ray.init(**kwargs)
    yield from _serving(cfg, context, Span(began, time.time()))


def _serving(cfg: ClusterSettings, context, up: Span) -> Iterator[Span]:
    """``ray_session`` once Ray is up: the dashboard announced, Ray stopped on exit."""
    try:
        if cfg.address == "local":
            lower_background_priority(context.address_info["session_dir"])
        announce_dashboard(cfg, context.dashboard_url, context.address_info["gcs_address"])
        yield up
    finally:
        stop_kept_spark()  # a Spark kept for a later job (cluster.keep_spark) runs on this Ray
        ray.shutdown()


@contextlib.contextmanager
def node_address(cfg: ClusterSettings) -> Iterator[None]:
    """While open, the embedded Ray started takes ``cluster.bind_address`` as its node's address:
    127.0.0.1 by default, so that Ray's, Spark's and RayDP's ports listen on this machine alone
    (``raydp_fixes.loopback_node``). Another address opens them to a network, with a warning.
    Open for ``ray.init`` alone: Ray's processes inherit the setting then, and the processes this
    one starts later (``ray start`` of a cluster, a job's command) do not. A driver joining a Ray
    on the loopback (another process's embedded one) takes the loopback as its address too."""
    if cfg.address != "local":  # joining: a Ray on the loopback (an embedded one) takes it too
        with raydp_fixes.loopback_node() if _on_loopback(cfg.address) else contextlib.nullcontext():
            yield
        return
    if ipaddress.ip_address(cfg.bind_address).is_loopback:
        with raydp_fixes.loopback_node():
            yield
        return
    log.warning("cluster.bind_address=%s: the embedded Ray's and Spark's ports are open to the "
                "network; Ray asks for its token and Spark for its secret (docs/security.md)",
                cfg.bind_address)
    yield


def _on_loopback(address: str) -> bool:
    """Whether a Ray address (``host:port``, ``ray://host:port``) is on this machine's loopback."""
    host = address.rsplit("//", 1)[-1].rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, or auto
        return False


def sweep_namespace(sweep_dir: Path) -> str:
    """A sweep's own Ray namespace: its trials' named actors (RayDP's, whose names are fixed; the
    sweep's Spark turns and ledger) are apart from another sweep's and a single run's on the same
    cluster."""
    import hashlib

    return f"{NAMESPACE}-sweep-{hashlib.sha256(str(sweep_dir).encode()).hexdigest()[:12]}"


def set_ray_environment(cfg: ClusterSettings) -> None:
    """The environment Ray and Ray Train read when they start (a value already set is kept)."""
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # Ray Train's run-state API: the dashboard's Train page and /api/train/v2/runs/v1 list the run.
    # An embedded Ray without its dashboard has no one to show it to: its state actor (one more
    # process a run) is left out.
    if cfg.dashboard or cfg.address != "local":
        os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
    # Ray Train's controller polls its workers every 2 s by default, and each of its steps (the
    # group started, running, ended; a lost worker) waits for the next poll: 0.5 s took 4 s off a
    # run's stop on 2 cores, 0.2 s about 0.6 s more off a 2-worker run's start and stop (a poll is
    # one small call to each worker).
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    if cfg.address == "local":
        # Ray Train's preemption watcher (one more actor, over a second of CPU, started while the
        # first steps run) waits for a cloud's notice that a node is going away: the embedded
        # Ray's one node is this machine, which gets none.
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


# Linux's limit on a Unix socket's path, and what the embedded Ray puts after its temp directory's
# root: /ray/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store
SOCKET_PATH_MAX = 107
SESSION_SOCKET = len("/ray/session_2026-11-29_07-41-21_123456_1234567/sockets/plasma_store")


def scratch_environment(cfg: ClusterSettings) -> dict[str, str]:
    """The environment that puts the run's scratch under ``cluster.scratch_dir``: the copies of
    s3:// models (this process and, on the embedded Ray, every Ray process, which inherits it),
    and the embedded Ray's session and spilled objects (``RAY_TMPDIR``); Spark's local
    directories are its settings (spark_settings.py). A cluster's workers get the model copies'
    place in the job's runtime environment (``init_options``); Ray's own directories there are
    ``ray start``'s."""
    if not cfg.scratch_dir:
        return {}
    env = {MODEL_CACHE_ENV: f"{cfg.scratch_dir}/models"}
    if cfg.address == "local":
        longest = len(cfg.scratch_dir) + SESSION_SOCKET
        if longest > SOCKET_PATH_MAX:
            raise InputError(f"cluster.scratch_dir={cfg.scratch_dir}: Ray's sockets under it would "
                             f"have paths of {longest} characters, over Linux's {SOCKET_PATH_MAX}; "
                             f"use a path of at most {SOCKET_PATH_MAX - SESSION_SOCKET}")
        env["RAY_TMPDIR"] = cfg.scratch_dir
    return env


def init_options(cfg: ClusterSettings, run_name: str, waiting_cpus: float) -> dict:
    """``ray.init``'s arguments: the namespace, the JVM flags and the run's name for the job, and
    an embedded Ray's resources and dashboard (or the address of the cluster to join)."""
    kwargs = dict(
        namespace=NAMESPACE,
        job_config=JobConfig(
            jvm_options=list(JVM_FLAGS), metadata={"job_name": run_name, "raydp_llm_run": run_name}
        ),  # the Jobs page's Name
        log_to_driver=bool(cfg.verbose),
        logging_level=logging.INFO if cfg.verbose else logging.ERROR,
    )
    if cfg.address != "local":
        if cfg.scratch_dir:  # every worker of the job copies s3:// models there
            kwargs["runtime_env"] = {"env_vars": scratch_environment(cfg)}
        return kwargs | {"address": cfg.address}
    if cfg.bind_address != "0.0.0.0":  # 0.0.0.0: the address Ray picks
        kwargs["_node_ip_address"] = cfg.bind_address
    return kwargs | dict(
        num_cpus=cfg.num_cpus or embedded_cpus(waiting_cpus),
        object_store_memory=cfg.object_store_mb * 1024 * 1024 if cfg.object_store_mb else None,
        include_dashboard=cfg.dashboard,
        dashboard_host=cfg.dashboard_host,
        dashboard_port=cfg.dashboard_port,
    )


def embedded_cpus(waiting_cpus: float) -> int:
    """The embedded Ray's logical CPUs: the machine's cores (as Ray counts them: cgroup limits
    too), plus ``waiting_cpus``, those of the DDP workers of a training job. The worker group
    starts while Spark's executors hold their CPUs (training/driver/fit.py, ``started``); until the
    ETL
    is done its workers only wait for their data, so their CPUs are counted twice rather than
    taken from Spark and the Ray tasks beside it, which keep the room they had. Once training
    starts, Spark has stopped and given its CPUs back."""
    return machine_cpus() + math.ceil(waiting_cpus)


# a container's CPU quota and its period, in microseconds: cgroup v2's file, then v1's two
CGROUP_QUOTAS = (("/sys/fs/cgroup/cpu.max",),
                 ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def machine_cpus() -> int:
    """This machine's cores, fewer where a container's CPU quota (its cgroup's) says so, as
    Ray counts them when it starts without ``num_cpus``."""
    cpus = os.cpu_count() or 1
    for files in CGROUP_QUOTAS:
        try:
            quota, period = " ".join(Path(f).read_text() for f in files).split()[:2]
            if int(quota) > 0:
                return min(cpus, max(1, int(quota) // int(period)))
        except (OSError, ValueError):  # no such cgroup, or no quota ("max", -1)
            continue
    return cpus


# Ray's helper processes (Python) that poll on a timer: the dashboard (its head and modules), the
# per-node dashboard agent (reporter, metrics export; the raylet's child), the log monitor and the
# autoscaler monitor
BACKGROUND = ("dashboard/dashboard.py", "log_monitor.py", "monitor.py", "ray::DashboardAgent")


def lower_background_priority(session_dir: str) -> int:
    """The embedded Ray's background processes (``BACKGROUND``, and what they start) at the lowest
    CPU priority (nice 19). On a machine with few cores their timers wake up while the training
    step needs every core, and DDP waits for the slowest worker: measured 15-20 % of throughput on
    2 cores. At nice 19 they still run, and the dashboard still answers, whenever training leaves a
    core idle. Only this session's processes (their command line names its directory) are
    touched; returns how many."""
    lowered = 0
    ours = [p for p in psutil.process_iter(["cmdline"])
            if session_dir in " ".join(p.info["cmdline"] or [])]
    candidates = ours + [c for p in ours for c in p.children()]  # the raylet's agent too
    for proc in candidates:
        with contextlib.suppress(psutil.Error):
            cmdline = " ".join(proc.cmdline())
        if not any(name in cmdline for name in BACKGROUND):
            continue
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                p.nice(19)
                lowered += 1
    return lowered


def secure_token_file(path: Path | None = None) -> None:
    """Ray 2.60 writes its token file ``~/.ray/auth_token`` with the umask's mode (0644: every user
    of the machine could read the token and reach the dashboard and the cluster). Create it 0600
    before Ray would, or make one this user owns 0600."""
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
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # 256 bits, as Ray's own tokens


def quiet_python_logs() -> None:
    """Silence Ray Data's and PySpark's deprecation chatter that RayDP triggers (nothing to act
    on)."""
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="DataFrame.sql_ctx is an internal property")
    warnings.filterwarnings(
        "ignore", category=DeprecationWarning, module=r"ray\.data\."
    )  # Ray's own defaults
