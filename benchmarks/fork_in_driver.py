"""A Ray Train run in the driver, then a Spark start: does the start hang? (issue 66; raydp_fixes 7)

    python benchmarks/fork_in_driver.py [--rounds 3] [--stock] [--bound 120] [--debug]

One driver on an embedded Ray (dashboard off, as the tests' Ray), in rounds, as the suite's driver
did when it hung: a Ray Train run of two workers (``TorchTrainer``, a loop that only reports),
which leaves its controller's handle for the driver's garbage collector, then a RayDP Spark
started as the product starts it (engines/spark.py), its rows handed to Ray and Spark stopped
(benchmarks/actor_notices.py's round). ``--stock`` launches Spark's driver JVM as PySpark 3.5.7
does, with Python run in the fork of the driver (raydp_fixes.py, 7, undone); without it, as the
product does. A Spark round that has not ended in ``--bound`` seconds is a hang: the script prints
the Spark thread's stack and exits 1 at once (its engines cannot be stopped then). ``--debug`` runs
Ray's backend at debug level: the driver's core-worker log then shows lines written by another
pid, the fork, which the script counts."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from actor_notices import ROOT, Tally, spark_round  # noqa: E402 - the benchmarks' own, beside this


def train_once(storage: Path) -> float:
    """A two-worker Ray Train run from this driver; its seconds."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def loop(_config):
        import ray.train

        ray.train.report({"step": 1})

    began = time.monotonic()
    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2,
                                                    resources_per_worker={"CPU": 0.5}),
                 run_config=RunConfig(name=f"run-{time.time_ns()}",
                                      storage_path=str(storage))).fit()
    return time.monotonic() - began


def bounded_spark_round(cluster, log_dir: Path, tally: Tally, bound: float) -> float:
    """``spark_round`` in a thread, waited for ``bound`` seconds; its seconds, or the process ends
    with the thread's stack."""
    began, failed = time.monotonic(), []

    def run():
        try:
            spark_round(cluster, log_dir, tally)
        except BaseException as err:  # noqa: BLE001 - reported by the waiting thread
            failed.append(err)

    thread = threading.Thread(target=run, name="spark-round", daemon=True)
    thread.start()
    thread.join(bound)
    if thread.is_alive():
        stack = "".join(traceback.format_stack(sys._current_frames()[thread.ident]))
        print(f"HUNG: the Spark round did not end in {bound:g} s; its thread:\n{stack}", flush=True)
        os._exit(1)
    if failed:
        raise failed[0]
    return time.monotonic() - began


def lines_of_other_pids() -> int:
    """Lines of this driver's core-worker log written by another process (a fork before exec)."""
    logs = Path(tempfile.gettempdir(), "ray").glob(
        f"session_*_{os.getpid()}/logs/python-core-driver-*_{os.getpid()}.log")
    count = 0
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            fields = line.split()
            count += line.startswith("[") and len(fields) > 3 and fields[3] != str(os.getpid())
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound", type=float, default=120, help="seconds a Spark round may take")
    parser.add_argument("--stock", action="store_true",
                        help="PySpark's own launch of its JVM: Python run in the fork")
    parser.add_argument("--debug", action="store_true", help="Ray's backend logs at debug level")
    args = parser.parse_args()
    if args.debug:
        os.environ["RAY_BACKEND_LOG_LEVEL"] = "debug"
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.configs import make_config
    from raydp_llm.engines import spark as engine
    from raydp_llm.engines.ray_cluster import ray_session

    if args.stock:
        engine.gateway_without_preexec = contextlib.nullcontext
    cluster = make_config("cluster.dashboard=false", "cluster.keep_spark=false").cluster
    tally = Tally()
    with ray_session(cluster, "fork_in_driver", waiting_cpus=1), \
            tempfile.TemporaryDirectory() as tmp:
        for number in range(1, args.rounds + 1):
            trained = train_once(Path(tmp) / "runs")
            spark_s = bounded_spark_round(cluster, Path(tmp), tally, args.bound)
            print(f"round {number}: Ray Train run {trained:.1f} s, then a Spark round "
                  f"{spark_s:.1f} s; lines of other pids in the driver's log: "
                  f"{lines_of_other_pids()}", flush=True)
    print(f"{args.rounds} rounds, {'stock' if args.stock else 'fixed'} launch: no hang")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
