"""Recovery from a lost worker: SIGKILL of one DDP worker after a checkpoint, against the same run
undisturbed.

    python benchmarks/recovery.py [--steps 600] [--kill-after 200] [--set key=value ...]

Both runs train the default baby GPT with 2 DDP workers on the sample corpus's ETL cache, a
checkpoint every ``--kill-after`` steps. The disturbed run loses a worker right after its first
checkpoint. Printed: when Ray Train noticed (kill → its restart decision), when training ran again
(kill → the first step after the restart, from the first evaluation after it less the steps in
between), the steps trained twice, and what the kill cost in wall time against the undisturbed run.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(out: Path, overrides: list[str], kill_after: int | None) -> dict:
    import psutil
    from hydra import compose, initialize_config_dir

    from raydp_llm.cli.inputs import typed_settings
    from raydp_llm.cli.train import run
    from raydp_llm.core.registry import register_configs
    from raydp_llm.training.driver.metrics import read_events, read_metrics

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    seen: dict = {}

    def kill():
        path = out / "metrics.csv"
        while not (path.exists() and any(r["step"] >= kill_after for r in read_metrics(path))):
            time.sleep(0.05)
        workers = [
            p
            for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].startswith("ray::RayTrainWorker")
        ]  # the dashboard, and so the state API, is off: processes by their title
        seen["kill"] = time.time()
        os.kill(workers[-1].pid, signal.SIGKILL)
        while not any(r["step"] > kill_after for r in read_metrics(path)):
            time.sleep(0.05)
        seen["row"], seen["rows"] = time.time(), read_metrics(path)

    if kill_after:
        threading.Thread(target=kill, daemon=True).start()
    t = time.perf_counter()
    summary = run(typed_settings(cfg), out)
    result = {"train_s": summary["train_s"], "wall_s": time.perf_counter() - t}
    if kill_after:
        (event,) = read_events(out)
        row = next(r for r in seen["rows"] if r["step"] > kill_after)
        resumed_at = seen["row"] - (row["step"] - event["from_step"]) * row["step_time_s"]
        result |= {"detect_s": event["time"] - seen["kill"], "recover_s": resumed_at - seen["kill"],
                   "from_step": event["from_step"]}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--kill-after", type=int, default=200)
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides for both runs")
    args = parser.parse_args()
    from hydra import compose, initialize_config_dir

    from raydp_llm.cli.inputs import typed_settings
    from raydp_llm.core.registry import register_configs
    from raydp_llm.engines.ray_cluster import ray_session

    overrides = [
        f"train.max_steps={args.steps}",
        f"train.checkpoint_interval={args.kill_after}",
        f"train.eval_interval={args.kill_after // 4}",
        "cluster.dashboard=false",
        *args.set,
    ]
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cluster = typed_settings(compose(config_name="config", overrides=overrides)).cluster
    with tempfile.TemporaryDirectory() as tmp, ray_session(cluster, "recovery"):
        run_once(
            Path(tmp) / "warm", [*overrides, "train.max_steps=10", "train.eval_interval=10"], None
        )  # ETL cache
        calm = run_once(Path(tmp) / "calm", overrides, None)
        hurt = run_once(Path(tmp) / "hurt", overrides, args.kill_after)
    print("\n| run | training s | kill → restart decided s | kill → training again s | went on "
          f"from step |\n|---|---:|---:|---:|---:|\n| undisturbed | {calm['train_s']:.1f} | | | "
          f"|\n| a worker killed after step {args.kill_after} | {hurt['train_s']:.1f} | "
          f"{hurt['detect_s']:.1f} | {hurt['recover_s']:.1f} | {hurt['from_step']} |")
    print(f"\nthe kill cost {hurt['train_s'] - calm['train_s']:.1f} s of training wall "
          "time", file=sys.stderr)


if __name__ == "__main__":
    main()
