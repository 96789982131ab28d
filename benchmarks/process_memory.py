"""Memory of a run's processes over time: every process below a command (the driver, Ray's workers
and daemons, Spark's JVMs and Python workers), sampled and sorted into roles by their command lines.
Used by ``etl_1gb.py`` and ``soak.py``."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import psutil

# role → a test on a process' command line (the first that matches wins)
ROLES = [
    ("spark python worker", lambda c: "pyspark.daemon" in c or "pyspark.worker" in c),
    ("spark driver JVM", lambda c: "org.apache.spark.deploy.SparkSubmit" in c),
    ("raydp gateway JVM", lambda c: "AppMasterEntryPoint" in c),
    (
        "executor JVM",
        lambda c: "java" in c.split(" ", 1)[0] and "ray/jars" in c,
    ),  # executors, app master
    ("dashboard", lambda c: "dashboard" in c.lower()),
    (
        "ray daemons",
        lambda c: any(
            d in c for d in ("raylet", "gcs_server", "log_monitor", "monitor.py", "runtime_env")
        ),
    ),
]


def role_of(proc: psutil.Process, driver_pid: int) -> str:
    if proc.pid == driver_pid:
        return "driver"
    try:
        line = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if line.startswith(
        "ray::"
    ):  # a Ray worker's title: ray::<actor class>[.<method>], or ray::IDLE
        return line.split()[0].split(".")[0]
    return next((name for name, test in ROLES if test(line)), "other")


class Sampler(threading.Thread):
    """Samples the RSS of ``pid`` and its descendants every ``interval_s``: per role, the largest
    process and the role's sum; ``samples`` is a list of (seconds since start, {role: (max MB, sum
    MB)})."""

    def __init__(self, pid: int, interval_s: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.interval_s, self.samples = pid, interval_s, []
        self._stop_event, self._start = threading.Event(), time.monotonic()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            sample = self.sample()
            if sample:
                self.samples.append((time.monotonic() - self._start, sample))

    def sample(self) -> dict[str, tuple[float, float]]:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return {}
        by_role: dict[str, list[float]] = defaultdict(list)
        for proc in procs:  # a process may end while it is looked at: it is left out
            try:
                rss_mb, role = proc.memory_info().rss / 2**20, role_of(proc, self.pid)
            except psutil.Error:
                continue
            if role != "gone":
                by_role[role].append(rss_mb)
        return {role: (max(mbs), sum(mbs)) for role, mbs in by_role.items()}

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def peaks(self) -> dict[str, tuple[float, float]]:
        """Per role: the peak of its largest process and the peak of its sum, over the samples."""
        peaks: dict[str, tuple[float, float]] = {}
        for _, sample in self.samples:
            for role, (biggest, total) in sample.items():
                old = peaks.get(role, (0.0, 0.0))
                peaks[role] = (max(old[0], biggest), max(old[1], total))
        return peaks

    def at(self, seconds: float) -> dict[str, tuple[float, float]]:
        """The sample nearest ``seconds`` after the start."""
        return min(self.samples, key=lambda s: abs(s[0] - seconds))[1]
