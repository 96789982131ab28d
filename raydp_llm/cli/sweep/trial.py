"""A job of a sweep as a Ray Tune trial: the process Tune starts for it runs the job as Hydra's
basic launcher would in the sweep's own process (``run_job``: the job's directory, its log, its
``.hydra/``), and its Ray Train run reports its evaluations to Tune
(training/driver/trial_reports.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydra.core.utils import JobReturn, run_job
from hydra.types import HydraContext
from omegaconf import DictConfig

from raydp_llm.cli.sweep import records
from raydp_llm.training.driver.trial_reports import evaluations_to_tune, report_to


@dataclass
class SweepJob:
    """A job of the sweep: its number, the overrides that make it, its directory, its composed
    config (Hydra's node with the sweep's directory resolved; None when it does not compose), and
    the one line that refused it, if any."""

    num: int
    overrides: list[str]
    out_dir: Path
    config: DictConfig | None
    settings: object | None = None  # its typed Settings, once checked (launcher.py)
    corpus: object | None = None  # what its data reads (cli/inputs.check_inputs)
    error: str | None = None


@dataclass
class TrialWork:
    """What every trial needs of the launcher: the jobs by number (a trial proposed as the sweep
    runs, by ``hydra/sweeper=optuna``, brings its own config: ``trial_config["config"]``), Hydra's
    config loader and task function (``cli/train.py``'s ``main``). Not the sweep's callbacks: they
    hold its Ray."""

    jobs: dict[int, SweepJob]
    config_loader: object
    task_function: object

    def config_of(self, trial_config: dict) -> DictConfig:
        if "config" in trial_config:
            return trial_config["config"]
        return self.jobs[trial_config["job"]].config


def run_trial(trial_config: dict, work: TrialWork) -> None:
    """Tune's function trainable: job ``trial_config["job"]`` of ``work``, in a process of its own
    on this node. Tune places a trial's process in the trial's placement group and makes every
    task and actor it starts join it (``placement_group_capture_child_tasks``): the job's Spark
    master, Ray Data's tasks, would wait for room there forever. The job's process is started
    outside it, and ends with the trial's (its owner). A job that failed raises, and its trial is
    an error."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    runner = ray.remote(num_cpus=0)(JobProcess).options(
        scheduling_strategy=here, name=process_name(trial_config["job"])).remote()
    config = work.config_of(trial_config)
    try:
        value = ray.get(runner.run.remote(config, work.config_loader, work.task_function,
                                          evaluations_to_tune()))
    finally:
        ray.kill(runner)
    if value is None or records.is_nan(value):
        raise RuntimeError(f"job {trial_config['job']} failed; see its directory in "
                           f"{config.hydra.sweep.dir}")


def process_name(num: int) -> str:
    """The Ray name of job ``num``'s process (in the sweep's namespace)."""
    return f"raydp_llm_sweep_job_{num}"


def end_process(num: int, timeout_s: float = 30) -> None:
    """Job ``num``'s process ended, and gone: a trial a scheduler stopped has its process ended by
    Ray after the trial's, and until then it writes on (a restart it takes its workers' end for);
    its row is kept only once it is gone."""
    import time

    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        runner = ray.get_actor(process_name(num))
    except ValueError:  # ended already
        return
    ray.kill(runner)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            ray.get(runner.alive.remote(), timeout=0.5)
        except RayActorError:
            return
        except GetTimeoutError:
            continue


class JobProcess:
    """The process that runs a trial's job as Hydra's basic launcher would run it in the sweep's
    own (``run_job``: the job's directory, its log, its ``.hydra/``)."""

    def alive(self) -> bool:
        return True

    def run(self, config: DictConfig, config_loader, task_function, to_tune) -> float | None:
        from hydra._internal.callbacks import Callbacks

        from raydp_llm.core.registry import register_configs

        register_configs()  # the resolvers the job's config may still name
        report_to(to_tune)
        # the sweep's callbacks are the launcher's process's: a trial runs none (records.py)
        context = HydraContext(config_loader=config_loader, callbacks=Callbacks())
        ret = run_job(hydra_context=context, task_function=task_function, config=config,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        return _value(ret)


def _value(ret: JobReturn) -> float | None:
    """The job's return value (its final validation loss); None when it raised."""
    try:
        return ret.return_value
    except Exception:  # noqa: BLE001 - the job's log has it; the trial fails
        return None

