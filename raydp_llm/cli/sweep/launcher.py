"""The sweep's launcher: a multirun's jobs one after another in this process (the embedded
default), or as Ray Tune trials side by side on the cluster (``hydra/launcher=ray``).

``launch`` reads in order: compose and check every job (one that does not compose or is refused
is a ``failed`` row); leave out the jobs an earlier run of this sweep directory did, matched by
what defines them (``records``); then either run the others in turn (``one_after_another``), or
(``side_by_side``) refuse a job the cluster can never hold, run each distinct data setting's ETL
once, here, into the ETL cache, which every trial then reads without a Spark of its own (on a
cluster, where the cache is not shared, each trial's Spark waits for its turn: one RayDP app of
the sweep at a time, engines/spark_turns.py), and let Ray Tune run the trials, as many at once as
the cluster holds (``sweep.max_concurrent`` caps them), stopping the poor ones early with
``sweep.scheduler=asha``. ``search`` runs a searcher's trials the same way (search.py: Optuna).
Each job's row is kept as it ends (records.py); Ctrl-C or SIGTERM stops every path; the summary
is the sweep's callback's (summary.py).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from omegaconf import OmegaConf, open_dict, read_write
from ray import tune

from raydp_llm.cli.inputs import check_inputs, typed_settings
from raydp_llm.cli.sweep import asha, records
from raydp_llm.cli.sweep.trial import SweepJob, TrialWork, run_trial
from raydp_llm.cli.sweep.watch import TrialLines, trial_groups
from raydp_llm.core.config import SweepSettings, TrainSettings
from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.timing import Stopwatch
from raydp_llm.engines import spark_turns

log = logging.getLogger(__name__)


def launch(plugin, job_overrides, initial_job_idx: int) -> list[JobReturn]:
    """Hydra's ``Launcher.launch`` of ``hydra_plugins.raydp_llm_sweep.RaydpLauncher``."""
    setup_globals()
    config = plugin.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    jobs = [compose(plugin, initial_job_idx + i, list(o), sweep_dir)
            for i, o in enumerate(job_overrides)]
    todo = left_to_run(jobs, sweep_dir)
    if concurrent(plugin.concurrent, config):
        side_by_side(plugin, todo, sweep_dir)
    else:
        one_after_another(plugin, todo, sweep_dir)
    ended = records.rows(sweep_dir)
    return [job_return(j, ended.get(j.num)) for j in jobs]


def concurrent(setting: str, config) -> bool:
    """``concurrent=true``; ``auto``: on a Ray cluster (``cluster.address`` not ``local``)."""
    if setting == "auto":
        return str(config.cluster.address) != "local"
    return setting in ("true", "1", "yes")


def left_to_run(jobs: list[SweepJob], sweep_dir: Path) -> list[SweepJob]:
    """The jobs an earlier run of this sweep directory did not do: not those with a completed or
    stopped row (matched by the overrides that define them, ``records.defining``), nor one whose
    run finished though the kill came before its row (its row is written now)."""
    done, todo = records.rows(sweep_dir), []
    for job in jobs:
        if records.is_done(done.get(job.num), job.overrides):
            continue
        if job.error is None and records.finished(job.out_dir, job.overrides):
            records.append(sweep_dir, records.job_row(job.num, job.overrides, job.out_dir,
                                                      records.span_of(job.out_dir)))
            continue
        todo.append(job)
    if len(todo) < len(jobs):
        print(f"sweep: {len(jobs) - len(todo)} of {len(jobs)} jobs done before; running the "
              "others", flush=True)
    return todo


def one_after_another(plugin, jobs: list[SweepJob], sweep_dir: Path) -> None:
    """Hydra's basic launcher's way: each job in this process, in turn (the sweep's callback keeps
    their rows). Ctrl-C or SIGTERM ends the job running (its Spark and workers stopped) and starts
    no other; the summary says how to continue."""
    with sigterm_as_ctrl_c():
        for job in jobs:
            if job.error is not None:
                refused(job, sweep_dir)
                continue
            set_aside(job)
            log.info("\t#%d : %s", job.num, " ".join(job.overrides))
            try:
                run_job(hydra_context=plugin.hydra_context, task_function=plugin.task_function,
                        config=job.config, job_dir_key="hydra.sweep.dir",
                        job_subdir_key="hydra.sweep.subdir")
            except (KeyboardInterrupt, SystemExit) as stop:
                if isinstance(stop, SystemExit) and stop.code != 130:
                    raise
                records.interrupted = True
                return
            configure_log(plugin.config.hydra.hydra_logging, plugin.config.hydra.verbose)


def side_by_side(plugin, todo: list[SweepJob], sweep_dir: Path) -> None:
    """The jobs as Ray Tune trials, as many at once as the cluster holds; each data setting's ETL
    first, once."""
    sweep: SweepSettings = OmegaConf.to_object(plugin.config.sweep)
    at_once = trials_at_once([j for j in todo if j.error is None], sweep.max_concurrent)
    if not prepared(todo, sweep_dir):
        records.interrupted = True  # the summary says how to continue
        return
    runnable = [j for j in todo if j.error is None]
    if runnable:
        work = TrialWork({j.num: j for j in runnable}, plugin.hydra_context.config_loader,
                         plugin.task_function)
        grid = {"job": tune.grid_search([j.num for j in runnable])}
        run_trials(Trials(grid, len(runnable)), sweep, at_once, sweep_dir, work)


def compose(plugin, num: int, overrides: list[str], sweep_dir: Path) -> SweepJob:
    """Job ``num``'s config, its sweep directory resolved here (a trial's process would draw
    another ``${uid:}``), and its checked settings, or the line that refuses them (a setting that
    does not compose, as ``model.n_layer=3.7``, too)."""
    try:
        config = plugin.hydra_context.config_loader.load_sweep_config(plugin.config, overrides)
    except Exception as err:  # noqa: BLE001 - Hydra's or OmegaConf's: the job fails, not the sweep
        said = [first_line(e, 150) for e in (err, err.__cause__) if e is not None]  # what, why
        return SweepJob(num, overrides, sweep_dir / str(num), None,
                        error=f"its settings do not compose: {'; '.join(said)}")
    with open_dict(config):
        config.hydra.job.id = config.hydra.job.num = num
        config.hydra.sweep.dir = str(sweep_dir)
        config.hydra.sweep.subdir = str(config.hydra.sweep.subdir)
    job = SweepJob(num, overrides, sweep_dir / str(config.hydra.sweep.subdir), config)
    task = copy.deepcopy(config)  # the job's own settings, as Hydra hands them to the job
    with read_write(task), open_dict(task):
        del task["hydra"]
    try:
        job.settings = typed_settings(task, overrides)
        job.corpus = check_inputs(job.settings)
    except InputError as err:
        job.error = str(err)
    return job


def refused(job: SweepJob, sweep_dir: Path, error: str | None = None,
            began: float | None = None) -> None:
    """A job that cannot run: its ``failed`` row, with its one line; the sweep goes on."""
    job.error = error or job.error
    log.error("sweep job %d: %s", job.num, job.error)
    records.append(sweep_dir, records.job_row(job.num, job.overrides, job.out_dir,
                                              (began or time.time(), time.time()), job.error))
    print(f"[job {job.num}] failed: {job.error}", flush=True)


def needs(t: TrainSettings) -> dict[str, float]:
    """The Ray resources a job's trial holds while it trains: its workers'."""
    workers = {"CPU": t.num_workers * t.cpus_per_worker}
    return workers | ({"GPU": float(t.num_workers)} if t.use_gpu else {})


def trials_at_once(jobs: list[SweepJob], cap: int | None) -> int:
    """How many trials the running cluster holds at once (every trial counted as the largest,
    beside one Spark where a trial runs its own ETL), at most ``cap``; one line for a job the
    cluster can never hold."""
    have = ray.cluster_resources()
    for job in jobs:
        for resource, amount in needs(job.settings.train).items():
            if amount > have.get(resource, 0):
                raise InputError(
                    f"sweep job {job.num} ({' '.join(job.overrides) or 'no overrides'}) needs "
                    f"{amount:g} {resource}s for its workers (train.num_workers × "
                    f"train.cpus_per_worker) but the Ray cluster has "
                    f"{have.get(resource, 0):g}; lower them or add nodes")
    spark = max((spark_cpus(j.settings.cluster) for j in jobs if not j.settings.data.cache),
                default=0.0)
    return room([j.settings.train for j in jobs], cap, len(jobs), spark)


def spark_cpus(cluster) -> float:
    """The Ray CPUs of one Spark: its executors', and RayDP's app master's one."""
    return cluster.executors * cluster.executor_ray_cpus + 1


def room(trains: list[TrainSettings], cap: int | None, count: int, beside: float = 0.0) -> int:
    """Trials of these training settings the running cluster holds at once, at most ``cap`` and
    ``count`` (how many there are), ``beside`` CPUs kept for a Spark."""
    have, most = dict(ray.cluster_resources()), math.inf
    have["CPU"] = have.get("CPU", 0) - beside
    for t in trains:
        for resource, amount in needs(t).items():
            most = min(most, have.get(resource, 0) // amount)
    return int(max(1, min(most, cap or math.inf, count)))


def prepared(todo: list[SweepJob], sweep_dir: Path) -> bool:
    """Each job's data in turn (``prepare_data``); False when Ctrl-C or SIGTERM came meanwhile:
    the ETL running is stopped (its Spark with it), no other starts, and the job it was for is
    no failed row (it runs when the sweep is continued). PySpark turns the interrupt into its
    own exception inside a py4j call, so the signal is noted as well as raised."""
    asked = threading.Event()

    def handler(*_):
        asked.set()
        raise KeyboardInterrupt

    try:
        with stop_signals_to(handler):
            for job in todo:
                prepare_data(job, sweep_dir, asked)
                if asked.is_set():
                    return False
    except KeyboardInterrupt:
        return False
    return True


def prepare_data(job: SweepJob, sweep_dir: Path, asked: threading.Event | None = None) -> None:
    """Job ``job``'s data into the ETL cache, unless an earlier job's with the same data settings
    is there already (a hit, no Spark); a job whose ETL fails is a failed row, but for one that
    ``asked`` to stop (Ctrl-C: KeyboardInterrupt). Without the cache (data.cache=false) each
    trial runs its own ETL, one Spark at a time."""
    if job.error is not None:
        refused(job, sweep_dir)
    elif job.settings.data.cache:
        from raydp_llm.cli.prepare_job import run_checked

        clock, out_dir = time.time(), sweep_dir / "etl" / str(job.num)
        out_dir.mkdir(parents=True, exist_ok=True)
        try:  # what it made, as prepare prints it, into the job's ETL directory
            with open(out_dir / "prepare.txt", "w") as f, contextlib.redirect_stdout(f):
                run_checked(job.settings, job.corpus, out_dir, Stopwatch())
            print(f"[job {job.num}] data ready ({out_dir / 'prepare.txt'})", flush=True)
        except Exception as err:  # noqa: BLE001 - the job fails, the sweep goes on
            if asked is not None and asked.is_set():
                raise KeyboardInterrupt from None
            refused(job, sweep_dir, f"its ETL failed: {first_line(err, 300, with_type=True)}",
                    clock)


def set_aside(job: SweepJob) -> None:
    """An unfinished earlier attempt's directory, renamed ``<num>.attempt-<k>``: the job runs
    again in its own directory and continues that attempt's newest complete checkpoint
    (``train.resume=auto`` looks among the sweep's directories)."""
    if job.out_dir.is_dir():
        k = 1
        while job.out_dir.with_name(f"{job.out_dir.name}.attempt-{k}").exists():
            k += 1
        job.out_dir.rename(job.out_dir.with_name(f"{job.out_dir.name}.attempt-{k}"))


@dataclass
class Trials:
    """What Tune runs: a grid of the jobs composed before (``param_space``), or the trials a
    searcher proposes as room frees (``search``: hydra/sweeper=optuna); ``count`` of them at
    most; ``left()``: whether proposals were left unmade (an interrupted search); ``pruned``: the
    ids of the trials the scheduler stopped (the searcher tells them pruned); ``halt``: set by
    Ctrl-C or SIGTERM (the searcher proposes nothing more)."""

    param_space: dict
    count: int
    left: Callable[[], bool] = lambda: False
    search: object | None = None
    pruned: set = field(default_factory=set)
    halt: threading.Event = field(default_factory=threading.Event)


def run_trials(trials: Trials, sweep: SweepSettings, at_once: int, sweep_dir: Path,
               work: TrialWork) -> None:
    """Ray Tune's run of ``trials``, ``at_once`` at a time; each trial's process is on this node
    (its run directory is here) and holds no CPU: its Ray Train workers hold theirs."""
    for job in work.jobs.values():
        set_aside(job)
    here = f"node:{ray.util.get_node_ip_address()}"
    trainable = tune.with_resources(tune.with_parameters(run_trial, work=work),
                                    {"cpu": 0, here: 0.001})
    lines = TrialLines(work.jobs, sweep_dir)
    log.info("sweep: %d trials, %d at once, in %s", trials.count, at_once, sweep_dir)
    # Tune's own console (its new output prints a header at any verbosity): TrialLines says it
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    schedule = asha.scheduler(sweep, work.jobs, trials.pruned, sweep_dir)
    with spark_turns.one_at_a_time(), tune_halts_on_signals(trials.halt), \
            trial_groups() as groups:
        lines.groups = groups
        samples = trials.count if trials.search is not None else 1  # a grid: each point once
        tune.Tuner(
            trainable, param_space=trials.param_space,
            tune_config=tune.TuneConfig(max_concurrent_trials=at_once, num_samples=samples,
                                        search_alg=trials.search, trial_name_creator=trial_name,
                                        trial_dirname_creator=trial_name,
                                        scheduler=schedule),
            run_config=tune.RunConfig(name=f"tune-{time.strftime('%Y%m%d-%H%M%S')}",
                                      storage_path=str(sweep_dir), verbose=0, callbacks=[lines],
                                      failure_config=tune.FailureConfig(max_failures=0)),
        ).fit()
    # Ctrl-C (or SIGTERM): Tune stops every trial and returns; the summary says so (summary.py)
    unstarted = trials.search is None and len(lines.started) < trials.count
    records.interrupted = (trials.halt.is_set() or len(lines.ended) < len(lines.started)
                           or unstarted or trials.left())


def search(plugin, trials: Trials, jobs: dict[int, SweepJob], cap: int | None) -> None:
    """A searcher's trials (hydra/sweeper=optuna), proposed as Tune asks, as many at once as the
    cluster holds jobs of the sweep's own settings, at most ``cap``; one at a time on the
    embedded Ray unless asked (``hydra/launcher=ray``), as the grid's jobs run."""
    config = plugin.config
    sweep: SweepSettings = OmegaConf.to_object(config.sweep)
    at_once = 1
    if concurrent(plugin.concurrent, config):
        at_once = room([OmegaConf.to_object(config.train)], cap, trials.count)
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    work = TrialWork(jobs, plugin.hydra_context.config_loader, plugin.task_function)
    run_trials(trials, sweep, at_once, sweep_dir, work)


def trial_name(trial) -> str:
    """A trial's name and directory in Tune's results: its job's number (a searcher's trial's
    config holds the job's whole config, no name)."""
    return f"job_{trial.config['job']}"


@contextlib.contextmanager
def tune_halts_on_signals(halt: threading.Event):
    """Ctrl-C or SIGTERM while Tune runs: ``halt`` set, so that the searcher proposes nothing
    more (Tune's own Ctrl-C handler lets its loop finish a step, which may ask for a trial), then
    Tune told to end by its other stop signal, SIGUSR1: it stops every trial and returns, and the
    sweep writes its summary."""
    def handler(*_):
        halt.set()
        os.kill(os.getpid(), signal.SIGUSR1)

    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        with stop_signals_to(handler):
            yield
    finally:
        del os.environ["TUNE_DISABLE_SIGINT_HANDLER"]


@contextlib.contextmanager
def stop_signals_to(handler):
    """Ctrl-C (SIGINT) and SIGTERM handled by ``handler`` within; the handlers before, after."""
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, was in previous.items():
            signal.signal(s, was)


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """SIGTERM (a scheduler's, ``kill``) is passed on as Ctrl-C: the job running stops (its Spark
    and workers with it), and the sweep writes its summary."""
    previous = signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def job_return(job: SweepJob, row: dict | None) -> JobReturn:
    """What Hydra gets back of a job: its final validation loss, NaN for a job that failed (as
    ``cli_errors`` returns in a sweep: Hydra's sweeper would end the sweep on a failed job)."""
    ok = row is not None and row["status"] in records.DONE
    value = row.get("final_val_loss") if ok else None
    ret = JobReturn(overrides=job.overrides, cfg=job.config, status=JobStatus.COMPLETED,
                    _return_value=float("nan") if value is None else value)
    ret.working_dir = str(job.out_dir)
    return ret
