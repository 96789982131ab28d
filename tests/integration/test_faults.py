"""Faults injected on the real engines (Ray, Ray Train, RayDP Spark): a run survives them and
continues the curve it would have drawn undisturbed, or stops with one line and keeps what it wrote.
docs/reliability.md lists them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import commands
from helpers.configs import CACHE_DIR, NO_CHECK, make_config
from helpers.etl import prepare
from helpers.paths import ROOT
from helpers.processes import kill_tree, ray_actor_pids
from helpers.progress import has_row, wait_for
from helpers.s3 import BUCKET
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.cli.train import run
from raydp_llm.core import integrity, storage
from raydp_llm.core.errors import InputError, RunFailure
from raydp_llm.data import cache
from raydp_llm.training.driver.metrics import read_events, read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end-to-end runs

# Two DDP workers, gradient accumulation and a shuffle buffer in play; no dropout, so that a resume
# with another number of workers continues the same curve too (dropout masks depend on how a batch
# is split over the workers).
OVERRIDES = [
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=64",
    "model.block_size=32",
    "train.batch_size=16",
    "train.grad_accum=2",
    "train.max_steps=160",
    "train.eval_interval=20",
    "train.eval_batches=null",
    "train.checkpoint_interval=40",
    "train.keep_checkpoints=4",
    "optim.lr=3e-3",
    f"data.cache_dir={CACHE_DIR}",
    NO_CHECK,
]


@pytest.fixture(scope="module")
def overrides(corpus_dir) -> list[str]:
    return [f"data.path={corpus_dir}", *OVERRIDES]


@pytest.fixture(scope="module")
def reference(ray_cluster, overrides, tmp_path_factory) -> dict:
    """An undisturbed run: its metrics rows by step, its directory and its checkpoints by step."""
    out = tmp_path_factory.mktemp("reference") / "run"
    run(make_config(*overrides), out)
    return {"rows": {r["step"]: r for r in read_metrics(out / "metrics.csv")}, "dir": out,
            "checkpoints": checkpoints(out)}


def checkpoints(out_dir: Path) -> dict[int, Path]:
    """A run directory's training checkpoints by step (those whose state file a kill left
    readable)."""
    found = {}
    for path in out_dir.glob("ray_results/*/checkpoint_*/train_state.json"):
        try:
            found[json.loads(path.read_text())["step"]] = path.parent
        except ValueError:
            continue
    return found


def assert_same_curve(out_dir: Path, reference: dict, after: int) -> list[dict]:
    """The run's rows are the reference's from step ``after`` on: each step once, losses within
    1e-3."""
    rows = read_metrics(out_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [s for s in reference["rows"] if s > after]
    for r in rows:
        want = reference["rows"][r["step"]]
        assert r["val_loss"] == pytest.approx(want["val_loss"], rel=1e-3), r["step"]
        assert r["train_loss"] == pytest.approx(want["train_loss"], rel=1e-3), r["step"]
    return rows


def test_a_killed_worker_is_replaced_and_the_run_continues_its_curve(
    reference, overrides, tmp_path, capfd
):
    """SIGKILL of one RayTrainWorker after a checkpoint: Ray Train restarts the worker group from
    that checkpoint (train.max_failures), the console says so, and metrics.csv, TensorBoard and
    summary.json hold each step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, killed = tmp_path / "run", {}

    def kill_a_worker():
        wait_for(lambda: has_row(out, 40), 300, "the first checkpoint")
        worker = ray_actor_pids("RayTrainWorker")[-1]
        killed["checkpoint"] = max(checkpoints(out))
        os.kill(worker, signal.SIGKILL)
        killed["pid"] = worker

    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    summary = run(make_config(*overrides), out)
    killer.join()

    assert killed["pid"] and summary["restarts"] == 1 and summary["status"] == "finished"
    (event,) = read_events(out)
    assert (
        event["event"] == "restart"
        and len(event["lost"]) == 1
        and event["from_step"] == killed["checkpoint"]
    )
    console = capfd.readouterr()
    assert f"restart 1 of at most 3: worker {event['lost'][0]} lost" in console.out + console.err
    rows = assert_same_curve(out, reference, after=0)
    assert summary["final_val_loss"] == rows[-1]["val_loss"]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("val_loss")] == [int(r["step"]) for r in rows]


def live_placement_groups() -> set[str]:
    from ray.util import placement_group_table

    return {k for k, pg in placement_group_table().items() if pg["state"] != "REMOVED"}


def idle_cpus() -> float:
    """The Ray's CPUs free now (Spark kept for the next job holds some)."""
    import ray

    return ray.available_resources().get("CPU", 0.0)


def wait_for_cpus(cpus: float) -> None:
    """Until ``cpus`` are free: a group's removal returns its CPUs a moment after the run ends."""
    wait_for(lambda: idle_cpus() >= cpus, 30, f"{cpus} free CPUs")


def test_an_elastic_group_trains_with_the_workers_that_fit(reference, overrides, tmp_path):
    """train.min_workers: 4 workers asked for, as many as the tests' Ray has CPUs fit (3: the
    machine's 2 and one more); the run goes ahead with those. Its data is the reference run's
    cache entry: no Spark holds CPUs meanwhile."""
    import ray

    from raydp_llm.engines.spark import stop_kept_spark

    stop_kept_spark()  # its executor's CPU would fit one worker fewer
    fit = int(ray.cluster_resources()["CPU"])
    wait_for_cpus(fit)  # the run before's worker group's, returned a moment after it ended
    summary = run(
        make_config(
            *overrides,
            "train.num_workers=4",
            "train.min_workers=1",
            "train.batch_size=24",
            "train.grad_accum=1",
            "train.max_steps=40",
            "train.checkpoint_interval=0",
        ),
        tmp_path / "run",
    )
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert summary["status"] == "finished" and [r["step"] for r in rows] == [20, 40]
    assert 1 < fit < 4 and {r["workers"] for r in rows} == {fit}


def test_a_killed_controller_fails_the_run_and_frees_its_workers_cpus(ray_cluster, overrides,
                                                                     tmp_path):
    """SIGKILL of Ray Train's controller mid-run, the driver alive (as one job of a sweep): the run
    fails, and its worker group's placement group, which outlives the controller in Ray, is freed
    by the driver (rank 0 posted it to the hand-off; Ray Train's own cleaner actor needs the State
    API, which the tests' Ray, without a dashboard, does not serve).
    Last of the elastic runs: Ray Train's autoscaling coordinator keeps the dead controller's
    request for CPUs until it expires (a minute), and an elastic group sees fewer meanwhile."""
    import ray

    from raydp_llm.engines.spark import stop_kept_spark

    out, killed, before = tmp_path / "run", {}, live_placement_groups()

    def kill_the_controller():
        wait_for(lambda: has_row(out, 20), 300, "the first evaluation")
        (controller,) = ray_actor_pids("TrainController")
        killed["groups"] = live_placement_groups() - before  # the run's worker group's
        os.kill(controller, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_controller, daemon=True)
    killer.start()
    with pytest.raises(Exception, match="TrainController"):
        run(make_config(*overrides), out)
    killer.join()
    assert len(killed["groups"]) == 1
    assert live_placement_groups() == before
    stop_kept_spark()
    wait_for_cpus(ray.cluster_resources()["CPU"])  # the workers' back: never, were it not freed


def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before_on_another_number_of_workers(
    reference, overrides, tmp_path, caplog
):
    """The newest checkpoint of an interrupted run of 2 workers has a truncated model.safetensors
    (a kill during its upload): train.resume=auto names it, skips it and continues the previous one
    on 1 worker, every step on the same windows, so the curve goes on; an explicit resume refuses
    it. (One run for both: each resume is a Ray Train start, about 25 s here.)"""
    runs = tmp_path / "outputs"
    interrupted = runs / "interrupted"
    shutil.copytree(reference["dir"], interrupted)
    saved = checkpoints(interrupted)
    shutil.rmtree(saved[160])  # it stopped before its last step
    weights = saved[120] / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)

    summary = run(make_config(*overrides, "train.num_workers=1"), runs / "resumed")
    assert summary["resumed_from"] == str(saved[80])
    assert f"skipping damaged checkpoint {saved[120]}: model.safetensors has" in caplog.text
    rows = assert_same_curve(runs / "resumed", reference, after=80)
    assert {r["workers"] for r in rows} == {1}
    with pytest.raises(InputError, match=r"train.resume=.*/checkpoint_[^/]+: damaged, "
                                         r"model.safetensors has \d+ bytes, \d+ were written; give "
                                         r"a model/ directory or checkpoint"):
        check_inputs(make_config(*overrides, f"train.resume={saved[120]}"))


def start_train(*args: str, cwd: Path) -> subprocess.Popen:
    """The command as a user starts it (``helpers.commands``: nothing of this process's state)."""
    return commands.start("raydp_llm.train", *args, cwd=cwd)


def test_a_killed_driver_is_continued_by_the_same_command(reference, overrides, tmp_path):
    """SIGKILL of the driver mid-training: the same command, run again, continues from the last
    complete checkpoint (the killed run is no longer live: its process is gone) and finishes with
    the undisturbed curve."""
    command = [*overrides, "name=driver_kill"]
    first = start_train(*command, cwd=tmp_path)
    runs = tmp_path / "outputs" / "driver_kill"
    wait_for(
        lambda: any(has_row(d, 40) for d in runs.glob("*")), 300, "a checkpoint", proc=first
    )
    kill_tree(first)
    (killed_dir,) = runs.glob("*")
    assert not has_row(killed_dir, 160)  # killed mid-run

    again = commands.run("raydp_llm.train", *command, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # The newest complete checkpoint (a worker may finish writing one after the driver's kill,
    # before Ray ends it: it counts too)
    last = max(step for step, d in checkpoints(killed_dir).items() if integrity.problem(d) is None)
    (resumed_dir,) = set(runs.glob("*")) - {killed_dir}
    summary = json.loads((resumed_dir / "summary.json").read_text())
    assert summary["resumed_from"] == str(checkpoints(killed_dir)[last])
    assert_same_curve(resumed_dir, reference, after=last)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_run_killed_the_moment_a_seal_lands_leaves_that_checkpoint_whole(where, overrides, s3,
                                                                          tmp_path):
    """A sharded checkpoint (FSDP: each worker uploads its part) in train.storage_path: the seal
    (complete.json) is the last of its files to land, locally and on S3. The run is killed the
    moment a seal appears: every file the seal lists is whole, and train.resume takes it."""
    root = str(tmp_path / "storage") if where == "local" else f"s3://{BUCKET}/seal-{tmp_path.name}"
    command = [*overrides, "name=seal", "train.strategy=fsdp", "model.n_layer=4",
               "model.n_embd=256", "model.n_head=4", "train.checkpoint_interval=20",
               f"train.storage_path={root}", f"s3.endpoint_url={s3.endpoint_url}"]
    proc = start_train(*command, cwd=tmp_path)
    seals: list = []

    def sealed() -> bool:
        with contextlib.suppress(OSError):
            seals.extend(storage.find_files(root, integrity.MARKER, s3))
        return bool(seals)

    wait_for(sealed, 300, "a sealed checkpoint", proc=proc)
    kill_tree(proc)
    checkpoint = seals[0][0].rsplit("/", 1)[0]
    local = tmp_path / "fetched"
    storage.fetch(checkpoint, local, s3)
    assert (local / "shards").is_dir()  # sharded: every worker wrote a part
    assert integrity.problem(local) is None  # every file it lists is there, whole
    if where == "local":  # and none landed after the seal (S3's times are in whole seconds)
        landed = {p.name: p.stat().st_mtime_ns for p in Path(checkpoint).rglob("*") if p.is_file()}
        assert landed.pop(integrity.MARKER) >= max(landed.values())
    assert check_inputs(make_config(*command, f"train.resume={checkpoint}")).files


def test_a_diverging_run_stops_at_once_with_one_line(ray_cluster, overrides, tmp_path):
    """A huge learning rate without clipping: the first non-finite gradient norm ends the run with
    one line (step, value, what to do; the entry point turns it into exit 1: test_cli.py); no
    checkpoint, no model/, and summary.json reports no final loss."""
    out = tmp_path / "run"
    with pytest.raises(RunFailure) as failure:
        run(
            make_config(*overrides, "optim.lr=1e6", "optim.grad_clip=0", "optim.warmup_steps=0"),
            out,
        )
    message = str(failure.value)
    assert re.fullmatch(r"training diverged at step \d+ \(loss \S+, gradient norm (nan|inf)\); no "
                        r"checkpoint was taken before it: lower optim.lr or set optim.grad_clip "
                        rf"and start again; metrics in {out}",
                        message), message
    assert (
        not checkpoints(out) and not (out / "model").exists() and not (out / "samples.txt").exists()
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["final_val_loss"] is None
    assert json.loads((out / "run.json").read_text())["status"] == "diverged"


# The run.json a run that failed left in a directory: a later run must not write there.
FAILED_RUN_RECORD = {
    "run_id": "20261122-101010-abcdef",
    "out_dir": None,  # the directory, filled in by the test
    "host": "h",
    "pid": 1,
    "pid_started": 0.0,
    "heartbeat": 0.0,
    "status": "failed",
    "resumed_from": None,
}


def _two_refused_runs_started_at_once(tmp_path: Path) -> list[subprocess.CompletedProcess]:
    both = [
        subprocess.Popen(
            [sys.executable, "-m", "raydp_llm.train", "optim.lr=0", NO_CHECK],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in both]
    return [subprocess.CompletedProcess(p.args, p.returncode, out) for p, out in zip(both, outputs)]


def test_runs_of_the_same_second_get_their_own_directories_and_refused_ones_leave_none(tmp_path):
    """Two shells start a run at once, each refused at the door: exit 2, and no run directory left
    (issue 67: each left Hydra's, so the newest entry under outputs/ was no run). The directories
    runs of one second would get differ (Hydra's ${now:} has second resolution); and a run refuses,
    before Hydra writes anything, a directory another run wrote to."""
    from raydp_llm.cli.preflight import compose

    refused = _two_refused_runs_started_at_once(tmp_path)
    assert [p.returncode for p in refused] == [2, 2], [p.stdout for p in refused]
    assert all("optim.lr=0.0 is not allowed" in p.stdout for p in refused)
    assert not list((tmp_path / "outputs" / "raydp_llm").iterdir())
    # <date>_<time, to the second>_<6 random hex digits>: the tail tells apart runs of the same
    # second
    dirs = [Path(compose("config", [], with_hydra=True).hydra.run.dir) for _ in range(2)]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_[0-9a-f]{6}", d.name) for d in dirs), (
        dirs
    )
    assert dirs[0].name[-6:] != dirs[1].name[-6:]
    assert dirs[0].parent == Path("outputs/raydp_llm")

    used = tmp_path / "used"
    (used / ".hydra").mkdir(parents=True)
    (used / "run.json").write_text(json.dumps({**FAILED_RUN_RECORD, "out_dir": str(used)}))
    p = subprocess.run(
        [sys.executable, "-m", "raydp_llm.train", f"hydra.run.dir={used}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2  # bad input
    assert [line for line in (p.stdout + p.stderr).splitlines() if line.strip()] == [
        f"error: {used}: another run wrote there already (run 20261122-101010-abcdef (pid 1 on "
        "h)); leave hydra.run.dir at its default (a new directory per run) or name a new "
        "directory"]
    assert not list((used / ".hydra").iterdir())  # Hydra wrote nothing there


@pytest.fixture(scope="module")
def two_builds(corpus_dir, tmp_path_factory) -> dict:
    """Two `prepare` runs of the same ETL cache key started at once, each with its own Ray."""
    root = tmp_path_factory.mktemp("two_builds")
    args = [f"data.path={corpus_dir}", f"data.cache_dir={root / 'cache'}", "model.block_size=16",
            NO_CHECK]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "raydp_llm.prepare", *args, f"hydra.run.dir={root / str(i)}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    return {"root": root, "codes": [p.returncode for p in procs], "outputs": outputs, "args": args}


def test_two_runs_building_the_same_cache_entry_both_succeed(two_builds):
    """One builds it, the other waits for it and uses it; one complete entry, no temporary one
    left."""
    root = two_builds["root"]
    assert two_builds["codes"] == [0, 0], two_builds["outputs"]
    manifests = [json.loads((root / str(i) / "manifest.json").read_text()) for i in range(2)]
    assert sorted(m["cache_hit"] for m in manifests) == [False, True]
    assert manifests[0]["windows_train"] == manifests[1]["windows_train"] > 0
    (entry,) = [p for p in (root / "cache").iterdir() if not p.name.startswith(".")]
    assert cache.entry_problem(entry) is None and not list((root / "cache").glob(".*.tmp-*"))


def test_a_damaged_cache_entry_is_rebuilt(two_builds, ray_cluster, tmp_path, caplog):
    """A hit checks the entry: a truncated Parquet file is found, named in one line, and the entry
    built again, never trained on with fewer windows."""
    (entry,) = [p for p in (two_builds["root"] / "cache").iterdir() if not p.name.startswith(".")]
    cache_dir = tmp_path / "cache"
    shutil.copytree(entry, cache_dir / entry.name)
    part = sorted((cache_dir / entry.name / "train").glob("*.parquet"))[0]
    with part.open("r+b") as f:
        f.truncate(part.stat().st_size - 100)
    cfg = make_config(*two_builds["args"][:1], f"data.cache_dir={cache_dir}", "model.block_size=16")
    data = prepare(cfg, check_inputs(cfg), tmp_path, to_ray=False, store=cache_dir)
    assert not data.cache_hit and data.entry == cache_dir / entry.name
    assert (
        f"ETL cache entry {cache_dir / entry.name} is damaged (train/{part.name} has" in caplog.text
    )
    assert cache.entry_problem(data.entry) is None
    assert json.loads((data.entry / "manifest.json").read_text()) == json.loads(
        (entry / "manifest.json").read_text()
    )
