"""What a lost node costs a run, on the simulated cluster: two Ray nodes on this machine
(tests/helpers/two_node_cluster.py, as the multinode tests run them) and the S3 stand-in (moto on
127.0.0.1). ``+experiment=emr`` keeps the ETL's result on S3; a first run builds it, a second
(no Spark) has its worker node removed without grace after the checkpoint of step 10, and a fresh
node added at once, as EMR replaces a lost core node.

    python benchmarks/node_loss.py [--corpus ../shared/data/tinyshakespeare.txt] [--repeats 1]

It prints, for each loss: the seconds from the node's removal to Ray Train's restart (the run's
``events.jsonl``) and to the first evaluation after it (TensorBoard's wall time: the restart, the
workers' start on the fresh node, the chunks read from S3 again, the steps since the checkpoint
trained again), against the undisturbed seconds between two evaluations of the same run. Then
the same loss with ``data.cache=false``: the blocks the lost node held are made again (a second
ETL into the run's storage while the workers wait: its seconds from ``summary.json``; chunks of
65,536 tokens, so that the lost node holds blocks no other node has copied).

First, a run with ``data.cache=false`` (the chunks from Spark to Ray's object store, at the default
chunk size: blocks over Ray's 100 KiB inline limit) prints where the hand-off's bytes are held: by
node, from its ``etl_stats.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from etl import S3_ENV, s3_stand_in

ROOT = Path(__file__).resolve().parents[1]
EVAL_EVERY, LOST_AFTER, STEPS = 2, 10, 30
JOB = [
    "+experiment=emr", "cluster.node_cpus=3", "cluster.executor_memory=1g",
    "cluster.driver_memory=1g", "model.n_layer=2", "model.n_head=2", "model.n_embd=64",
    "model.block_size=64", "train.batch_size=8", f"train.eval_interval={EVAL_EVERY}",
    "train.eval_batches=2", f"train.checkpoint_interval={LOST_AFTER}", "train.resume=never",
    "sample.max_new_tokens=10", "data.decontaminate=off",
]


class Cluster:
    """The two-node helper: its address, and ``replace`` (the worker node lost, a fresh one
    added)."""

    def __init__(self, tmp: str):
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": tmp}
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "helpers" / "two_node_cluster.py"), "3"],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        first = self._answer()
        self.address, self.nodes = first["address"], first["nodes"]

    def _answer(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the two-node cluster helper ended")
            if line.startswith("{"):
                return json.loads(line)

    def replace(self) -> dict:
        self.proc.stdin.write("replace\n")
        self.proc.stdin.flush()
        return self._answer()

    def stop(self) -> None:
        self.proc.stdin.write("stop\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def evaluations(run_dir: Path) -> list[tuple[int, float]]:
    """(step, wall time) of each val_loss TensorBoard holds, in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(e.step, e.wall_time) for e in events.Scalars("val_loss")]


def lose_a_node(cluster: Cluster, job: list[str], run_dir: Path) -> dict:
    """The run, its worker node replaced once step ``LOST_AFTER`` is evaluated; the seconds."""
    proc = subprocess.Popen([*job, f"train.max_steps={STEPS}", f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, env=cluster.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    metrics = run_dir / "metrics.csv"
    while not (metrics.exists() and f"\n{LOST_AFTER}," in metrics.read_text()):
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended before step {LOST_AFTER}")
        time.sleep(0.05)
    lost_at = time.time()
    cluster.replace()
    if proc.wait(timeout=600):
        raise RuntimeError(f"the run failed: {run_dir / 'train.log'}")
    (restart,) = [e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
                  if e["event"] == "restart"]
    seen = evaluations(run_dir)
    before = [t for _, t in seen if t < lost_at]
    after = min(t for _, t in seen if t > lost_at)
    rebuilds = json.loads((run_dir / "summary.json").read_text())["rebuilds"]
    return {"restart_s": restart["time"] - lost_at, "next_eval_s": after - lost_at,
            "from_step": restart["from_step"], "remade_s": sum(r["seconds"] for r in rebuilds),
            "between_evals_s": statistics.median(b - a for a, b in zip(before, before[1:]))}


def handed_off(cluster: Cluster, job: list[str], run_dir: Path) -> dict:
    """A data.cache=false run's hand-off: its chunks, and the MiB each node's object store holds
    (and those inline in the driver's memory)."""
    subprocess.run([*job, "data.cache=false", "train.max_steps=2", f"hydra.run.dir={run_dir}"],
                   cwd=ROOT, env=cluster.env, check=True, capture_output=True)
    held = json.loads((run_dir / "etl_stats.json").read_text())["object_store_bytes"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    head, worker = cluster.nodes
    return {"chunks": manifest["chunks_train"] + manifest["chunks_val"],
            "head": held.get(head, 0) / 2**20, "worker": held.get(worker, 0) / 2**20,
            "inline": held.get("inline", 0) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path,
                        default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with s3_stand_in(), tempfile.TemporaryDirectory(prefix="ray", dir="/tmp") as ray_tmp, \
            tempfile.TemporaryDirectory() as tmp:
        from raydp_llm.core import storage
        from raydp_llm.core.storage import S3Options

        s3 = S3Options(endpoint_url=os.environ[S3_ENV])
        storage.copy(str(args.corpus), "s3://bench/corpus/corpus.txt", s3)
        cluster = Cluster(ray_tmp)
        try:
            job = [sys.executable, "-m", "raydp_llm.train", f"cluster.address={cluster.address}",
                   *JOB, "data.path=s3://bench/corpus/", f"s3.endpoint_url={s3.endpoint_url}",
                   "train.storage_path=s3://bench/runs"]
            subprocess.run([*job, "train.max_steps=2", f"hydra.run.dir={tmp}/build"], cwd=ROOT,
                           env=cluster.env, check=True, capture_output=True)  # the S3 cache
            held = handed_off(cluster, job, Path(tmp) / "handoff")
            rows = [("S3 cache", lose_a_node(cluster, job, Path(tmp) / f"lost{i}"))
                    for i in range(args.repeats)]
            # chunks of 128 KiB: blocks on both nodes, some only on the one lost
            uncached = [*job, "data.cache=false", "data.chunk_tokens=65536"]
            rows += [("cache=false", lose_a_node(cluster, uncached,
                                                 Path(tmp) / f"lost_uncached{i}"))
                     for i in range(args.repeats)]
        finally:
            cluster.stop()
    print("\n| hand-off (data.cache=false) | head node MiB | worker node MiB | inline MiB |"
          f"\n|---:|---:|---:|---:|\n| {held['chunks']} chunks | {held['head']:.2f} | "
          f"{held['worker']:.2f} | {held['inline']:.2f} |")
    print("\n| data | node lost after step | restart from step | → restart s | "
          f"→ next evaluation s | data made again s | undisturbed {EVAL_EVERY} steps s |"
          "\n|---|---:|---:|---:|---:|---:|---:|")
    for data, r in rows:
        print(f"| {data} | {LOST_AFTER} | {r['from_step']} | {r['restart_s']:.1f} | "
              f"{r['next_eval_s']:.1f} | {r['remade_s']:.1f} | {r['between_evals_s']:.2f} |")


if __name__ == "__main__":
    main()
