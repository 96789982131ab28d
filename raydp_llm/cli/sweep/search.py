"""``hydra/sweeper=optuna``: Optuna proposes the jobs, as Ray Tune's own pattern has it: one Tuner
with Tune's ``OptunaSearch`` (TPE seeded by ``seed``, or another sampler) and the sweep's
scheduler (ASHA prunes as rungs fill), a new trial proposed as soon as a running one ends, at most
``sweep.max_concurrent`` (or ``n_jobs``) at once.

The study lives in the sweep directory (Optuna's journal file, ``optuna.journal``, or the
``storage`` given), so the same command run again over it continues the same study: the finished
trials inform the next proposals, whatever the cluster's size; a trial the earlier run left
running (a kill) is told failed and its job proposed again under its own number, continuing its
newest complete checkpoint. A job's end is told to Optuna: completed, its last ``sweep.metric``;
stopped by the scheduler, pruned; failed or refused, failed.

A config written for hydra-optuna-sweeper 1.3 runs unchanged: its keys (``params``, ``n_trials``,
``direction``, ``sampler``, ``storage``, ``study_name``, ``n_jobs``) are read from
``hydra.sweeper`` (conf/hydra/sweeper/optuna.yaml), ``sweep.*`` being the short form
(docs/sweeps.md). That plugin pins Optuna below 3; this one runs on Optuna 5 through Ray Tune.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from omegaconf import DictConfig, OmegaConf

from raydp_llm.core.errors import InputError

log = logging.getLogger(__name__)
RESULTS_FILE = "optimization_results.yaml"
DIRECTIONS = {"minimize": "min", "maximize": "max"}
SAMPLERS = ("optuna.samplers.TPESampler", "optuna.samplers.RandomSampler")


@dataclass(frozen=True)
class OptunaKeys:
    """hydra-optuna-sweeper 1.3's keys (``hydra.sweeper.*``), each falling back on ``sweep.*``."""

    n_trials: int
    mode: str  # min | max
    sampler: dict  # _target_ and its arguments
    storage: str | None  # a database URL; None: the journal file in the sweep directory
    study_name: str
    cap: int | None  # trials at once: sweep.max_concurrent, else n_jobs
    params: dict  # setting → a sweep in Hydra's grammar, beside the command line's

    @classmethod
    def of(cls, config: DictConfig) -> OptunaKeys:
        from raydp_llm.training.driver.best import order

        keys, sweep = config.hydra.sweeper, OmegaConf.to_object(config.sweep)
        for unsupported in ("custom_search_space", "search_space"):
            if keys.get(unsupported):
                raise InputError(f"hydra.sweeper.{unsupported}: not taken here; give the space "
                                 "in hydra.sweeper.params or on the command line")
        direction = keys.get("direction")
        if direction is not None and str(direction) not in DIRECTIONS:
            raise InputError(f"hydra.sweeper.direction={direction}: give minimize or maximize "
                             "(one objective: sweep.metric)")
        mode = DIRECTIONS[str(direction)] if direction else sweep.mode or order(sweep.metric)
        sampler = OmegaConf.to_container(keys.sampler) if keys.get("sampler") else {}
        target = sampler.get("_target_", SAMPLERS[0])
        if target not in SAMPLERS:
            raise InputError(f"hydra.sweeper.sampler._target_={target}: give one of "
                             f"{', '.join(SAMPLERS)}")
        if sampler.get("seed") is None:
            sampler["seed"] = int(config.seed)
        return cls(n_trials=int(keys.get("n_trials") or sweep.trials), mode=mode,
                   sampler={**sampler, "_target_": target}, storage=keys.get("storage"),
                   study_name=str(keys.get("study_name") or config.name),
                   cap=sweep.max_concurrent or keys.get("n_jobs"),
                   params=OmegaConf.to_container(keys.params) if keys.get("params") else {})

    def arguments(self) -> list[str]:
        """``params`` as command-line overrides."""
        return [f"{key}={value}" for key, value in self.params.items()]


def check_search(config: DictConfig) -> None:
    """The sweeper's keys and its search space, checked before anything starts."""
    keys = OptunaKeys.of(config)
    space_of([*config.hydra.overrides.task, *keys.arguments()], config)


def space_of(arguments: list[str], config: DictConfig) -> tuple[list[str], dict]:
    """The overrides every trial shares, and the search space: setting → Optuna distribution;
    one line for what Hydra or Optuna cannot take."""
    try:
        parsed = OverridesParser.create().parse_overrides(arguments)
    except Exception as err:  # noqa: BLE001 - Hydra's parser says what is wrong, on many lines
        raise InputError(f"hydra/sweeper=optuna: the search space does not parse: "
                         f"{str(err).splitlines()[0]}") from None
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    space = {o.get_key_element(): distribution(o, config) for o in parsed
             if o.is_sweep_override()}
    if not space:
        raise InputError("hydra/sweeper=optuna: no setting to search; give one as "
                         "optim.lr=tag(log,interval(1e-4,1e-2)) or model.n_layer=choice(2,4), "
                         "or in hydra.sweeper.params")
    return fixed, space


def distribution(override: Override, config: DictConfig):
    """An Optuna distribution of a sweep override: ``interval`` (a float; a whole number for a
    setting that is one, as ``int(interval(...))``, its ends rounded inwards; ``tag(log, ...)``
    samples it on a log scale), ``range`` (whole numbers or floats by its step, its end left out
    as in Hydra's grammar), ``choice`` (categorical). A tag other than ``log`` (Optuna's sweeper
    searched ``tag(lgo, ...)`` on a linear scale without a word) and an interval whose start is
    not below its end (Optuna's traceback) are one line."""
    import optuna.distributions as d

    sweep, key = override.value(), override.get_key_element()
    unknown = sorted(set(getattr(sweep, "tags", ())) - {"log"})
    if unknown:  # Optuna's sweeper reads "log" alone: any other tag searched on a linear scale
        raise InputError(f"{override.input_line}: tag {', '.join(unknown)} means nothing to the "
                         "search; tag(log,interval(a,b)) samples on a log scale")
    if isinstance(sweep, IntervalSweep) and not sweep.start < sweep.end:
        raise InputError(f"{override.input_line}: the interval's start is not below its end; "
                         f"give interval({min(sweep.start, sweep.end)},"
                         f"{max(sweep.start, sweep.end)})")
    if isinstance(sweep, IntervalSweep):
        log_scale = "log" in sweep.tags
        if _whole(OmegaConf.select(config, key.lstrip("+~"))) or \
                isinstance(sweep.start, int) and isinstance(sweep.end, int):
            low, high = math.ceil(sweep.start), math.floor(sweep.end)
            if low > high:
                raise InputError(f"{override.input_line}: {key} is a whole number and the "
                                 "interval holds none; widen it")
            return d.IntDistribution(low, high, log=log_scale)
        return d.FloatDistribution(sweep.start, sweep.end, log=log_scale)
    if isinstance(sweep, ChoiceSweep):
        return d.CategoricalDistribution(list(sweep.list))
    if isinstance(sweep, RangeSweep) and not sweep.shuffle:
        values = list(override.sweep_iterator())
        if all(isinstance(v, int) for v in values) and values:
            return d.IntDistribution(values[0], values[-1], step=int(sweep.step))
        return d.CategoricalDistribution(values)
    raise InputError(f"{override.input_line}: not a space Optuna samples; use interval(a,b), "
                     "tag(log,interval(a,b)), choice(a,b,...) or range(a,b)")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sweep(plugin, arguments: list[str]) -> list:
    """Hydra's ``Sweeper.sweep`` of ``hydra_plugins.raydp_llm_sweep.RaydpOptunaSweeper``."""
    import optuna

    from raydp_llm.cli.sweep.launcher import Trials, search
    from raydp_llm.cli.sweep.study import JobSearch, Plan, sampler_of, storage_of, write_results

    config = plugin.config
    keys = OptunaKeys.of(config)
    fixed, space = space_of([*arguments, *keys.arguments()], config)
    launcher = Plugins.instance().instantiate_launcher(
        hydra_context=plugin.hydra_context, task_function=plugin.task_function, config=config)
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_of(keys.storage, sweep_dir)
    study = optuna.create_study(storage=storage, study_name=keys.study_name, load_if_exists=True,
                                direction="minimize" if keys.mode == "min" else "maximize")
    plan = Plan(launcher, fixed, sweep_dir, study, keys.n_trials)
    plan.resume(str(config.sweep.metric))
    trials = Trials({}, plan.remaining, left=lambda: plan.asked < plan.remaining)
    trials.search = JobSearch(plan, trials.pruned, trials.halt, space=space,
                              metric=str(config.sweep.metric), mode=keys.mode,
                              sampler=sampler_of(keys.sampler, study), study_name=keys.study_name,
                              storage=storage)
    if plan.remaining:
        search(launcher, trials, plan.jobs, keys.cap)
    write_results(study, sweep_dir / RESULTS_FILE, str(config.name))
    return []
