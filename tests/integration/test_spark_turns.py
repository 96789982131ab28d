"""A sweep's Spark turns on the real Ray: a job's process killed while it holds the turn (during
its ETL) gives it back, where the lock it held before kept every other trial waiting forever."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray

from raydp_llm.engines import spark_turns

pytestmark = pytest.mark.integration


@ray.remote(num_cpus=0)
class JobHoldingItsTurn:
    """A job's process in its ETL: it holds the Spark turn."""

    def take(self) -> int:
        self.turn = spark_turns.spark_turn()
        self.turn.__enter__()
        return os.getpid()


def test_a_turn_held_by_a_killed_process_is_given_back(ray_cluster):
    with spark_turns.one_at_a_time():
        holder = JobHoldingItsTurn.remote()  # its handle kept: the actor lives until killed
        pid = ray.get(holder.take.remote())
        mine = threading.Event()

        def wait_for_my_turn():
            with spark_turns.spark_turn():
                mine.set()

        waiter = threading.Thread(target=wait_for_my_turn, daemon=True)
        waiter.start()
        assert not mine.wait(3)  # while the holder lives, its turn is its own
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        assert mine.wait(30), "the killed process's turn was never given back"
        waiter.join(10)
        print(f"turn given back {time.time() - killed:.1f} s after the kill")
        with spark_turns.spark_turn():  # and it is free again after the waiter's
            pass


def test_another_sweeps_spark_does_not_wait_for_this_sweeps_turn(ray_cluster, tmp_path):
    """Two sweeps on one cluster: while this namespace's turn is held, a driver in another sweep's
    namespace (``ray_cluster.sweep_namespace``) takes its own turn at once. That driver joins the
    tests' Ray, which is on the loopback, as ``ray_session`` joins one (on the loopback too)."""
    import subprocess
    import sys

    from raydp_llm.engines.ray_cluster import sweep_namespace

    assert sweep_namespace(tmp_path / "a") != sweep_namespace(tmp_path / "b")
    assert sweep_namespace(tmp_path / "a") == sweep_namespace(tmp_path / "a")
    other = ("import time\n"
             "from raydp_llm.core.config import ClusterSettings\n"
             "from raydp_llm.engines import spark_turns\n"
             "from raydp_llm.engines.ray_cluster import ray_session\n"
             f"cluster = ClusterSettings(address={ray.get_runtime_context().gcs_address!r})\n"
             f"with ray_session(cluster, 'other', namespace={sweep_namespace(tmp_path / 'b')!r}):\n"
             "    began = time.monotonic()\n"
             "    with spark_turns.one_at_a_time(), spark_turns.spark_turn():\n"
             "        print(f'turn after {time.monotonic() - began:.1f} s')\n")
    with spark_turns.one_at_a_time():
        holder = JobHoldingItsTurn.remote()
        ray.get(holder.take.remote())  # this namespace's turn is taken, and kept
        out = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True,
                             timeout=120)
        ray.kill(holder)
    assert out.returncode == 0, out.stderr[-2000:]
    waited = float(out.stdout.split("turn after ")[1].split()[0])
    assert waited < 5, out.stdout
