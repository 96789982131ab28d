"""The callback around every multirun (``-m``): one Ray for every job, each job's outcome
recorded, a summary at the end.

Hydra calls ``SweepSummary`` (``hydra.callbacks`` in conf/config.yaml) around the jobs its
launcher runs. In a sweep it starts Ray once: each job finds it running and uses it, and the ETL
cache serves every job after the first with the same data settings. Jobs run one after another in
this process (the embedded default), or as Ray Tune trials side by side (``hydra/launcher=ray``:
launcher.py, trial.py; ``hydra/sweeper=optuna``: search.py). Each job's row is kept as it ends
(records.py): a job that fails becomes a ``failed`` row with its error and the sweep goes on (in a
sweep, ``errors.cli_errors`` logs the error and returns NaN instead of exiting); one a scheduler
stopped early, a ``stopped`` row at the step it reached. At the end the sweep directory gets
``sweep_summary.csv`` (one row per job) and ``sweep.png`` (the jobs' validation curves), and the
console the table with the best job marked."""

from __future__ import annotations

import contextlib
import csv
import sys
import time
from pathlib import Path

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from raydp_llm.cli.sweep import records

# Hydra builds this callback for every command, a single run too (and one refused for its input
# in a second): Ray, the tracking and the plots are imported only where a sweep uses them.

COLUMNS = [
    "job",
    "overrides",
    "status",
    "steps",
    "best_val_loss",
    "final_val_loss",
    "final_val_bpc",
    "tokens_per_s",
    "wall_s",
    "started",
    "ended",
    "output_dir",
    "error",
]


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.job_started = 0.0
        self.ray = contextlib.ExitStack()
        self.parent_run: str | None = None  # tracking=mlflow: the jobs' parent run

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from raydp_llm.engines.ray_cluster import ray_session, sweep_namespace
        from raydp_llm.training.driver import tracking

        # a door too: the sweep's settings checked before Ray starts; its Ray and tracking
        check_sweep(config)
        cluster = OmegaConf.to_object(config.cluster)
        self.tracking = OmegaConf.to_object(config.tracking)
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        if self.tracking.kind == "mlflow":
            self.parent_run = tracking.open_sweep(self.tracking, sweep_dir, config.name)
        # the jobs' DDP workers counted twice, as a job's own embedded Ray counts them (room for
        # the worker group beside Spark, and for a Spark kept between jobs: cluster.keep_spark)
        train = OmegaConf.to_object(config.train)
        self.ray.enter_context(ray_session(cluster, f"{config.name} sweep",
                                           waiting_cpus=train.num_workers * train.cpus_per_worker,
                                           namespace=sweep_namespace(sweep_dir)))

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        self.job_started = time.time()

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        """A job run in this process (one after another): its row kept (records.py)."""
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        out_dir = Path(config.hydra.runtime.output_dir)
        failed = job_return.status != JobStatus.COMPLETED or records.is_nan(job_return.return_value)
        error = records.last_error(out_dir / f"{config.hydra.job.name}.log") if failed else None
        span = (self.job_started, time.time())
        records.append(Path(config.hydra.sweep.dir), records.job_row(
            config.hydra.job.num, list(config.hydra.overrides.task), out_dir, span,
            (error or "the job failed; see its log") if failed else None))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self.ray.close()
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = [row for _, row in sorted(records.rows(sweep_dir).items())]
        from raydp_llm.training.driver.best import order

        sweep = OmegaConf.to_object(config.sweep)
        mode = sweep.mode or order(sweep.metric)
        done = self._summarize(sweep_dir, jobs, sweep.metric, mode) if jobs else []
        if self.parent_run:
            from raydp_llm.training.driver import tracking

            tracking.close_sweep(self.tracking, self.parent_run, sweep_dir.resolve(), bool(done))
        if records.interrupted:
            print(f"sweep interrupted: the same command with hydra.sweep.dir={sweep_dir} runs the "
                  "jobs not done, each from its newest complete checkpoint", file=sys.stderr)
            sys.exit(130)

    def _summarize(self, sweep_dir: Path, jobs: list[dict], metric: str,
                   mode: str) -> list[dict]:
        """``sweep_summary.csv``, ``sweep.png`` and the console table; the completed jobs' rows."""
        from raydp_llm.training.driver.metrics import read_metrics
        from raydp_llm.training.driver.plots import plot_sweep

        swept = _varying_overrides([job["overrides"] for job in jobs])
        rows = [
            {**job, "overrides": " ".join(o for o in job["overrides"] if o in swept)}
            for job in jobs
        ]
        with (sweep_dir / "sweep_summary.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        done = [r for r in rows if r["status"] in records.DONE]
        if done:
            plot_sweep({f"#{r['job']} "
                        f"{r['overrides']}": read_metrics(Path(r["output_dir"]) / "metrics.csv")
                        for r in done}, sweep_dir / "sweep.png", title=f"sweep {sweep_dir.name}: "
                                                                       "validation loss")
        print(format_table(rows, best_job(rows, metric, mode), metric))
        stopped = sum(r["status"] == records.STOPPED for r in rows)
        print(f"sweep: {len(done) - stopped} of {len(rows)} jobs completed"
              f"{f', {stopped} stopped early' if stopped else ''}; sweep_summary.csv"
              f"{' and sweep.png' if done else ''} in {sweep_dir}")
        return done


def check_sweep(config: DictConfig) -> None:
    """``sweep.metric``: a column every evaluation reports (``check_metric``); with
    ``hydra/sweeper=optuna``, a search space it samples. Else one line and exit status 2, before
    anything starts."""
    from raydp_llm.core.errors import InputError

    try:
        check_metric(config)
        if str(config.hydra.sweeper._target_).endswith("RaydpOptunaSweeper"):
            from raydp_llm.cli.sweep.search import check_search

            check_search(config)
        else:
            check_scheduler(config)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def check_scheduler(config: DictConfig) -> None:
    """``sweep.scheduler`` stops trials that run side by side: refused where the jobs run one
    after another (the default launcher on the embedded Ray, or another launcher than ours), which
    would silently run every job to its end."""
    from raydp_llm.cli.sweep.launcher import concurrent
    from raydp_llm.core.errors import InputError

    scheduler, launcher = str(config.sweep.scheduler), config.hydra.launcher
    if scheduler == "none":
        return
    ours = str(launcher.get("_target_", "")).endswith("RaydpLauncher")
    if not (ours and concurrent(str(launcher.get("concurrent", "false")).lower(), config)):
        raise InputError(f"sweep.scheduler={scheduler}: it stops trials that run side by side, "
                         "and these jobs run one after another (the default launcher on the "
                         "embedded Ray, or concurrent=false); add hydra/launcher=ray, or drop "
                         "sweep.scheduler")


GRPO_METRICS = "val_reward"  # what a GRPO run's evaluations report: val_reward, val_reward_<fn>


def check_metric(config: DictConfig) -> None:
    """``sweep.metric`` names a column the jobs' evaluations report: a validation figure (a GRPO
    run's are its rewards: ``val_reward``), a mixture source's loss, or a task score of
    ``train.eval_tasks`` (reported at checkpoints: ranked there)."""
    from raydp_llm.core.errors import InputError
    from raydp_llm.training.driver import best

    sweep, data = OmegaConf.to_object(config.sweep), OmegaConf.to_object(config.data)
    train = OmegaConf.to_object(config.train)
    if train.objective == "grpo":
        if not sweep.metric.startswith(GRPO_METRICS):
            raise InputError(f"sweep.metric={sweep.metric}: a GRPO run (train.objective=grpo) "
                             "reports no such column; its evaluations report val_reward and "
                             "val_reward_<function>: give sweep.metric=val_reward")
        return
    tasks = []
    if train.eval_tasks and sweep.metric.startswith("task_"):  # lm-eval loads: only when asked
        from raydp_llm.training.tasks import task_list

        tasks = task_list(train.eval_tasks).names
    best.check(sweep.metric, tasks, [s.name for s in data.sources], None, setting="sweep.metric")


def best_job(rows: list[dict], metric: str, mode: str) -> int | None:
    """The job whose best ``metric`` over its evaluations is best (``mode``: min or max), among
    the completed and stopped ones; None when none reported it."""
    pick = min if mode == "min" else max
    scored = {}
    for row in rows:
        if row["status"] in records.DONE:
            value = records.best_value(Path(row["output_dir"]), metric, mode)
            if value is not None:
                scored[row["job"]] = value
    return pick(scored, key=scored.get) if scored else None


def format_table(rows: list[dict], best: int | None, metric: str = "val_loss") -> str:
    """The summary as a console table, the best job (by ``sweep.metric``) marked with ``*``."""

    def cell(value, digits=4) -> str:
        if value is None:
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    header = [
        "",
        "job",
        "overrides",
        "status",
        "steps",
        "best val",
        "final val",
        "val bpc",
        "tokens/s",
        "wall s",
    ]
    body = [["*" if r["job"] == best else "", str(r["job"]), r["overrides"] or "-", r["status"],
             cell(r.get("steps")), cell(r["best_val_loss"]), cell(r["final_val_loss"]),
             cell(r["final_val_bpc"]), cell(r["tokens_per_s"], 0), cell(r["wall_s"], 0)]
            for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(text.ljust(w) for text, w in zip(line, widths)).rstrip()
        for line in [header, *body]
    ]
    errors = [f"  job {r['job']} failed: {r['error']}" for r in rows if r["error"]]
    marked = [f"  * the best by {metric}"] if best is not None else []
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:], *marked,
                      *errors])


def _varying_overrides(per_job: list[list[str]]) -> set[str]:
    """The overrides not shared by every job: what the sweep varies."""
    return set().union(*per_job) - set.intersection(*map(set, per_job))
