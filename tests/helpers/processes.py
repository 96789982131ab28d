"""Processes of the engines found by their command lines, for the tests that kill one: Ray's
State API answers only through the dashboard, which the tests' own Ray does not run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil


def _pids(matches) -> list[int]:
    """The pids of the processes whose command line ``matches``, oldest first."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and matches(cmdline):
            found.append((proc.info["create_time"], proc.info["pid"]))
    return [pid for _, pid in sorted(found)]


def command_line(proc: psutil.Process) -> str:
    """``proc``'s command line, or "" when it has ended (a zombie's reads as ended too): a
    process tree holds short-lived helpers that can end between listing and reading."""
    try:
        return " ".join(proc.cmdline())
    except psutil.NoSuchProcess:  # ZombieProcess is one
        return ""


def niceness(proc: psutil.Process) -> int | None:
    """``proc``'s nice value, or None when it has ended."""
    try:
        return proc.nice()
    except psutil.NoSuchProcess:
        return None


def ray_actor_pids(class_name: str) -> list[int]:
    """The live Python actors of ``class_name``: Ray titles each worker process
    ``ray::<class>`` (``ray::<class>.<method>`` while one runs)."""
    return _pids(lambda c: c[0] == f"ray::{class_name}" or c[0].startswith(f"ray::{class_name}."))


def spark_executor_pids() -> list[int]:
    """RayDP's Spark executors: the Java actors started with the driver's port (RayDP's app
    master, the other Java actor, has none)."""
    return _pids(lambda c: c[0].endswith("java") and c[-1].endswith(".DefaultWorker")
                 and any(a.startswith("-Dspark.driver.port=") for a in c))


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL of the driver and everything it started (its embedded Ray) at once, as a crashed
    machine: Ray's workers would otherwise go on for a few seconds after the driver."""
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.Error):
            child.kill()
    proc.wait(timeout=60)


def kill_driver(proc: subprocess.Popen) -> list[psutil.Process]:
    """SIGKILL of the driver alone (by its pid), as an OOM kill or a lost terminal: what it
    started is left to end by itself. Returns the processes it had started, for a test to check
    that none outlives what comes next."""
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return tree


def alive(processes: list[psutil.Process]) -> list[str]:
    """Those of ``processes`` still running (a zombie has ended), by pid and title."""
    left = []
    for p in processes:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {command_line(p)[:120]}")
    return left
