"""The workarounds of Ray's and RayDP's bugs, each with its symptom, read against the versions in
``READ_AGAINST`` (tests/unit/test_raydp_fixes.py fails when the installed ones differ: read each
again then). The only module of raydp_llm that reaches into Ray's private modules.

1. Fetch tasks poison pooled Ray workers (``install``): ``from_spark``'s fetch task calls
   ``global_worker.set_load_code_from_local(True)`` (for its cross-language call to the executor)
   and never resets it. A later task that lands on the same worker process and creates an actor
   skips exporting the actor's class, so the actor dies with ``AssertionError: Expected str or
   bytes, got <class 'NoneType'>`` (seen with ``ray.data.read_parquet`` after ``from_spark``). The
   wrapper resets the flag when the task ends.
2. RayDP's driver-side agent logs into ``/tmp/ray/session_latest`` (``ray_logs_flag``): that link
   is left dangling once the sessions are deleted (Ray does not replace a dangling link), and the
   driver's JVM then exits before Spark starts. RayDP tells its app master's JVM this node's Ray
   session (``-Dray.logging.dir``), but not the driver's JVM: we do, from Ray's node, which no
   public API names.
3. Ray's agents outlive a killed driver (``reap_orphaned_agents``): when the driver of an embedded
   Ray is SIGKILLed, its raylet and GCS die with it, and the raylet's dashboard agent and
   runtime-env agent log that the raylet is dead and exit, but hang in their exit for about 100
   s (measured here: ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent``, reparented to init).
   The next embedded Ray's start ends those of a session whose raylet and GCS are gone, and the
   Python workers that were starting (one lived 30-40 s, and named the raylet's socket, which hid
   the agents from a check by command line): a killed sweep's processes do not outlive the command
   that continues it.
4. RayDP's driver and executors name the Spark application differently (``align_app_ids``): the
   driver keeps Spark's own ``spark-application-<ms>`` (RayDP's scheduler backend does not report
   the id its app master gives), the executors are told the app master's ``app-<time>``. With
   ``spark.authenticate`` on, Spark's block transfer serves a stream only to a client that
   authenticated with the application id the stream was opened under, so every block an executor
   fetches from the driver (each task's broadcast) and every large result the driver fetches from
   an executor is refused: ``SecurityException: Client app-… not authorized to read stream …
   (app spark-application-…)``. Before the first job, the driver's block transfer service (its
   server's streams, its client's authentication) takes the app master's id.
5. Ray takes no loopback node address on Linux (``loopback_node``): ``ray.init(_node_ip_address=
   "127.0.0.1")`` resolves it to the machine's routable address (``resolve_ip_for_localhost``),
   and Ray, RayDP's JVMs and Spark's executors listen there. Ray's single-machine mode
   (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the default on macOS), read once at import, keeps
   the node, and every port of Ray's, Spark's and RayDP's, on 127.0.0.1. Set only while Ray
   starts: its processes inherit it, and a process this one starts afterwards must not (a ``ray
   start`` in single-machine mode never joins another cluster: a test's third node did not).
6. RayDP waits for its app master with no timeout (``start_app_master``): ``SparkCluster.
   _set_up_master`` creates the master actor and waits on its ``start_up`` in ``ray.get``. Twice
   (CI's machine, and a CI-like suite here, both right after the test before had stopped a Spark)
   Ray 2.60 lost the creation: the core worker asked the GCS to create an actor it had not
   registered (``Failed to create actor. Status: Invalid: Actor may be already destroyed``, 172
   registrations for 173 creations), no death was ever published, and the wait never returned:
   the run hung before Spark started. Once more (CI at stop 64, right after a module's Spark and
   a job's own embedded Ray had stopped) the creation's registration itself timed out
   (``GetTimeoutError: There was timeout in registering an actor``: the GCS did not answer within
   Ray's ``gcs_server_request_timeout_seconds``, 60). Our copy of the method waits
   ``MASTER_START_S`` for the master (or takes the registration's timeout) and then starts it once
   more; a second miss is one error. At the stop after (CI, the same test) both tries missed and
   the session's Ray placed nothing more (a later training waited 15 minutes for its workers):
   caught live since in a CI-like suite, it was 7. The error says what Ray said then (``_seen``:
   the master's state, RayDP's Java master, the CPUs free) to tell a lost creation, a driver that
   was not told of its master (7), and a Ray with no CPU left apart.
7. PySpark forks the Ray driver and runs Python in the child (``gateway_without_preexec``):
   PySpark 3.5.7's ``launch_gateway`` starts the driver's JVM with ``Popen(preexec_fn=...)`` (to
   ignore SIGINT), so between fork and exec the child, a copy of the driver with its core worker
   and its gRPC connections, runs Python. A garbage collection there finalizes what the driver
   left for its collector (a finished Ray Train run's actor handles): the child's core worker
   then acts on the driver's connections (its debug log, in the driver's file under the JVM's
   pid: ``Replying to HandleWaitForActorRefDeleted`` for the run's controller, which the GCS then
   destroyed). The driver's next GCS request was never answered (``InternalKVAccessor::Put`` of
   RayDP's master class, both sides idle on a live connection) and, before, the ALIVE notice of
   an actor it created never came. Reproduced at will on 2026-12-02 (a Ray Train fit in the
   driver, then a Spark start: tests/integration/test_gradients.py then test_hf_models.py, one
   process: it hung 3 times of 3, and passed 2 of 2 with the fix); the suite had hung
   there three times. While Spark starts, the
   JVM is launched with no Python in the child: in a process group of its own (``Popen``'s
   ``process_group``, set by the C code of the fork), which a terminal's Ctrl-C does not reach,
   as PySpark's ignored SIGINT did not; the driver stops the JVM (engines/spark.py). RayDP's app
   master launches its own JVM the same way, but in its actor's process, which holds no handles
   of the run's.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Iterator

import psutil
import ray

READ_AGAINST = {"raydp": "1.6.5", "ray": "2.60.0", "pyspark": "3.5.7"}

_installed = False


def install() -> None:
    """Workaround 1, installed once a process (idempotent)."""
    global _installed
    if _installed:
        return
    from raydp.spark import dataset

    fetch = dataset._fetch_arrow_table_from_executor._function

    @ray.remote(max_retries=-1)
    def _fetch_arrow_table_from_executor(*args, **kwargs):
        from ray._private.worker import global_worker

        try:
            return fetch(*args, **kwargs)
        finally:
            global_worker.set_load_code_from_local(False)

    dataset._fetch_arrow_table_from_executor = _fetch_arrow_table_from_executor
    _installed = True


def ray_logs_flag() -> str:
    """Workaround 2: the driver JVM's flag naming this node's Ray session's log directory."""
    from ray._private.worker import _global_node

    return f"-Dray.logging.dir={_global_node.get_logs_dir_path()}"


_SESSION = re.compile(r"^(.*/session_[^/]+)/logs/")  # an open log file's session directory


WORKER = "ray/_private/workers/default_worker.py"  # a Python worker not yet titled ray::...


def reap_orphaned_agents() -> list[int]:
    """Workaround 3: SIGKILL of the Ray processes left to init (titled ``ray::...``, or Python
    workers still starting when the driver died: one lived 30-40 s after its raylet) whose
    session's raylet and GCS are no longer running (no live raylet or GCS names the session);
    returns their pids. A raylet or GCS is told by its program, not by its arguments: a worker's
    name the raylet's socket."""
    engines, orphans = [], []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
        words = proc.info["cmdline"] or [""]
        cmdline = " ".join(words)
        if words[0].endswith(("/raylet", "/gcs_server")):
            engines.append(cmdline)
        elif proc.info["ppid"] == 1 and (cmdline.startswith("ray::") or WORKER in cmdline):
            orphans.append(proc)
    reaped = []
    for proc in orphans:
        with contextlib.suppress(psutil.Error):
            mine = {m.group(1) for f in proc.open_files() if (m := _SESSION.match(f.path))}
            if mine and not any(session in line for session in mine for line in engines):
                proc.kill()
                reaped.append(proc.pid)
    return reaped


def align_app_ids(spark) -> str:
    """Workaround 4: the driver's block transfer service takes the application id RayDP's app
    master gave the executors (before any job: no stream is open yet); returns that id."""
    context = spark.sparkContext._jsc.sc()
    backend = context.schedulerBackend()
    app_id = _field(backend, "appId").get(backend).get()  # RayDP's AtomicReference
    transfer = context.env().blockManager().blockTransferService()
    transport = _field(transfer, "transportContext").get(transfer)
    server = _field(transport, "rpcHandler").get(transport)  # Spark's NettyBlockRpcServer
    _field(server, "appId").set(server, app_id)  # the id its streams are opened under
    _field(transfer, "appId").set(transfer, app_id)  # the id its fetch requests carry
    factory = _field(transfer, "clientFactory").get(transfer)
    for bootstrap in _field(factory, "clientBootstraps").get(factory):  # AuthClientBootstrap
        _field(bootstrap, "appId").set(bootstrap, app_id)  # the id its client authenticates with
    return app_id


def _field(obj, name: str):
    """The field ``name`` of a JVM object (py4j), declared by its class or a superclass, made
    accessible: Scala names a private field an inner class reads ``<class>$$<name>``."""
    cls = obj.getClass()
    while cls is not None:
        for field in cls.getDeclaredFields():
            if field.getName() == name or field.getName().endswith("$$" + name):
                field.setAccessible(True)
                return field
        cls = cls.getSuperclass()
    raise LookupError(f"{obj.getClass().getName()} has no field {name}: see raydp_fixes.py, 4")


SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """Workaround 5: while open, a Ray started by this process takes 127.0.0.1 as its node's
    address; its processes (GCS, raylet, and the workers the raylet starts) inherit the setting."""
    from ray._private import ray_constants

    was_cluster, was_set = ray_constants.ENABLE_RAY_CLUSTER, os.environ.get(SINGLE_MACHINE)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[SINGLE_MACHINE] = "0"
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = was_cluster
        if was_set is None:
            os.environ.pop(SINGLE_MACHINE, None)
        else:
            os.environ[SINGLE_MACHINE] = was_set


MASTER_START_S = 120.0  # the master starts in about 5 s on 2 cores, 20 s on CI's slower machines


@contextlib.contextmanager
def gateway_without_preexec() -> Iterator[None]:
    """Workaround 7: while open, PySpark launches its gateway JVM with no Python run in the forked
    driver (its ``preexec_fn`` dropped), in a process group of its own."""
    from pyspark import java_gateway

    popen = java_gateway.Popen

    def launch(command, **kwargs):
        kwargs.pop("preexec_fn", None)
        return popen(command, process_group=0, **kwargs)

    java_gateway.Popen = launch
    try:
        yield
    finally:
        java_gateway.Popen = popen


def start_app_master(cluster, resources: dict[str, float],
                     timeout_s: float = MASTER_START_S) -> None:
    """Workaround 6: RayDP's ``SparkCluster._set_up_master`` for ``cluster`` (its master actor
    named after the application, with ``resources`` as RayDP reads them from the settings), with a
    timeout: a master not started within ``timeout_s`` is ended and started once more."""
    from raydp.spark.ray_cluster_master import RAYDP_SPARK_MASTER_SUFFIX, RayDPSparkMaster

    name = cluster._app_name + RAYDP_SPARK_MASTER_SUFFIX
    options: dict = {"name": name}
    if resources:  # as RayDP: 1 CPU unless the settings say otherwise
        rest = dict(resources)
        options |= {"num_cpus": rest.pop("CPU", 1), "memory": rest.pop("memory", None),
                    "resources": rest}
    for attempt in (1, 2):
        master = None
        try:  # the creation's registration times out too (a GCS that did not answer)
            master = RayDPSparkMaster.options(**options).remote(cluster._configs)
            ray.get(master.start_up.remote(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            seen = _seen(master)
            _end_master(master, name)
            if attempt == 2:
                raise RuntimeError(f"RayDP's app master ({name}) did not start within "
                                   f"{timeout_s:.0f}s, twice ({seen}): see Ray's logs "
                                   "(raydp_fixes.py, 6)") from None
            continue
        cluster._spark_master_handle = master
        return


def _seen(master) -> str:
    """What Ray said of a master that did not start, to tell where it stopped: its state in the
    GCS's actor table (PENDING_CREATION: not placed, or its worker not started; ALIVE: its JVM or
    RayDP's Java master did not come up), RayDP's Java master, and the CPUs free (the master needs
    one to be placed, as a Ray actor by default, though it holds none once started)."""
    from ray._private import state

    try:
        found = state.actors(actor_id=master._actor_id.hex()) if master is not None else {}
        java = sorted({a["State"] for a in state.actors().values()
                       if a["Name"] == "RAY_APP_MASTER" and a["State"] != "DEAD"})
        groups = [g for g in ray.util.placement_group_table().values()
                  if g["state"] != "REMOVED"]
        held = sum(b.get("CPU", 0) for g in groups for b in g["bundles"].values())
        free, total = ray.available_resources(), ray.cluster_resources()
    except Exception as err:  # noqa: BLE001 - the GCS may not answer either: that is the finding
        return f"Ray did not say more: {type(err).__name__}"
    where = f"pid {found['Pid']}" if found.get("Pid") else "no process"
    return (f"the master {found.get('State', 'not registered')} ({where}); RayDP's Java master "
            f"{'/'.join(java) or 'none'}; {free.get('CPU', 0):g} of {total.get('CPU', 0):g} "
            f"CPUs free, {held:g} in {len(groups)} placement groups")


def _end_master(master, name: str, timeout_s: float = 30.0) -> None:
    """Kill a master that did not start (None: its registration timed out; the GCS may hold it
    by its name), and wait until its name is free for the next."""
    with contextlib.suppress(Exception):  # a creation Ray lost has nothing to kill
        ray.kill(master if master is not None else ray.get_actor(name))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:  # no actor of that name: free
            return
        time.sleep(0.2)
