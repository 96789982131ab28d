"""Does a long-lived driver stop hearing of the actors it creates? (issue 66; raydp_fixes.py, 7)

    python benchmarks/actor_notices.py [--minutes 60] [--spark-every 5] [--bound 60]

One driver on an embedded Ray (dashboard off, as the tests' Ray), for ``--minutes``, doing what the
test suite's driver does: in rounds, it creates actors (plain, named, detached, in a placement
group), calls each one once, and kills them; every ``--spark-every`` rounds it starts a RayDP Spark
(the product's ``spark_session``), hands rows to Ray from it (``from_spark``) and stops it.

Each first call on a new actor is waited for ``--bound`` seconds. One that does not answer is a
*lost notice* when the GCS holds the actor ALIVE (``ray.util.state``): the driver was never told,
and would wait forever. It prints a line a minute (actors made, Sparks made, the slowest first
call) and one per lost notice, with the driver's core-worker log lines about that actor; exits 1
if any notice was lost.

The driver's core-worker log is where the cause shows: ``--debug`` runs Ray's backend at debug
level (``RAY_BACKEND_LOG_LEVEL=debug``) so the log has each long poll to the GCS and its reply.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Tally:
    """What the soak made and saw."""

    started: float = field(default_factory=time.monotonic)
    actors: int = 0
    sparks: int = 0
    slowest_s: float = 0.0
    lost: list = field(default_factory=list)  # (minute, actor id, the GCS's state)


def actor_class():
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def ping(self) -> int:
            return os.getpid()

    return Probe


def one_round(probe, tally: Tally, bound: float, index: int) -> None:
    """Four actors made as the suite's driver makes them, each called once, then killed."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"CPU": 0.01}])
    ray.get(group.ready(), timeout=bound)
    actors = [
        probe.remote(),
        probe.options(name=f"probe-{index}").remote(),
        probe.options(name=f"detached-{index}", lifetime="detached").remote(),
        probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group)).remote(),
    ]
    for actor in actors:
        first_call(actor, tally, bound)
        ray.kill(actor)
    remove_placement_group(group)


def first_call(actor, tally: Tally, bound: float) -> None:
    import ray
    from ray.exceptions import GetTimeoutError

    began = time.monotonic()
    tally.actors += 1
    try:
        ray.get(actor.ping.remote(), timeout=bound)
    except GetTimeoutError:
        report_lost(actor, tally)
    tally.slowest_s = max(tally.slowest_s, time.monotonic() - began)


def report_lost(actor, tally: Tally) -> None:
    """A first call past its bound: what the GCS says of the actor, and what the driver heard."""
    from ray.util.state import get_actor

    actor_id = actor._actor_id.hex()  # Ray 2.60's handle has no public accessor of its id
    state = getattr(get_actor(actor_id), "state", "unknown")
    minute = (time.monotonic() - tally.started) / 60
    tally.lost.append((round(minute, 1), actor_id, state))
    print(f"LOST at {minute:.1f} min: actor {actor_id} is {state} in the GCS; "
          f"the driver's log says:", flush=True)
    for line in driver_log_lines(actor_id)[-12:]:
        print("   ", line[:240], flush=True)


def driver_log_lines(actor_id: str) -> list[str]:
    """This driver's core-worker log lines that name ``actor_id`` (its Ray's session directory is
    named after this process, as tests/fixtures/ray.py finds the tests' Ray's)."""
    lines = []
    logs = Path(tempfile.gettempdir(), "ray").glob(
        f"session_*_{os.getpid()}/logs/python-core-driver-*_{os.getpid()}.log")
    for log in sorted(logs):
        lines += [line for line in log.read_text(errors="replace").splitlines()
                  if actor_id in line]
    return lines


def spark_round(cluster, log_dir: Path, tally: Tally) -> None:
    """A Spark started, its rows handed to Ray as the ETL hands its chunks (``from_spark``, then
    Spark's copy released), and stopped."""
    import ray.data
    from raydp.spark import release_spark_recoverable

    from raydp_llm.engines import raydp_fixes
    from raydp_llm.engines.spark import spark_session

    raydp_fixes.install()
    with spark_session(cluster, app_name=f"soak-{tally.sparks}", log_dir=log_dir) as spark:
        df = spark.range(1000).repartition(4)
        dataset = ray.data.from_spark(df).materialize()
        release_spark_recoverable(df)
        assert dataset.count() == 1000
    tally.sparks += 1


def soak(args: argparse.Namespace) -> Tally:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.configs import make_config
    from raydp_llm.engines.ray_cluster import ray_session

    cluster = make_config("cluster.dashboard=false", "cluster.keep_spark=false").cluster
    tally, next_line = Tally(), 60.0
    with ray_session(cluster, "actor_notices", waiting_cpus=1), \
            tempfile.TemporaryDirectory() as tmp:
        probe, index = actor_class(), 0
        while time.monotonic() - tally.started < args.minutes * 60:
            one_round(probe, tally, args.bound, index)
            if index % args.spark_every == 0:
                spark_round(cluster, Path(tmp), tally)
            index += 1
            if time.monotonic() - tally.started > next_line:
                next_line += 60
                print(f"{(time.monotonic() - tally.started) / 60:5.1f} min: {tally.actors} actors, "
                      f"{tally.sparks} Sparks, slowest first call {tally.slowest_s:.2f} s, "
                      f"{len(tally.lost)} lost", flush=True)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--spark-every", type=int, default=5, help="rounds between Sparks")
    parser.add_argument("--bound", type=float, default=60, help="seconds a first call may take")
    parser.add_argument("--debug", action="store_true", help="Ray's backend logs at debug level")
    args = parser.parse_args()
    if args.debug:
        os.environ["RAY_BACKEND_LOG_LEVEL"] = "debug"
    tally = soak(args)
    print(f"{args.minutes:g} min: {tally.actors} actors, {tally.sparks} Sparks, slowest first "
          f"call {tally.slowest_s:.2f} s, lost notices: {tally.lost or 'none'}")
    return 1 if tally.lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
