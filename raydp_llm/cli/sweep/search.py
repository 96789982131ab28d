"""``hydra/sweeper=optuna``: Optuna proposes ``sweep.trials`` settings from a search space written
in Hydra's syntax (``optim.lr=tag(log,interval(1e-4,1e-2)) model.n_layer=choice(2,4)``), in batches
of as many as the cluster runs at once, each batch through the sweep's launcher (side by side with
``hydra/launcher=ray``, with its early stopping); each job's end is told to Optuna (completed: its
last ``sweep.metric``; stopped early: pruned; failed: failed).

Hydra's own Optuna sweeper (hydra-optuna-sweeper 1.2) pins Optuna below 3 and SQLAlchemy 1.3: this
one takes the same search-space syntax on Optuna 5, and batches by the cluster's room rather than a
fixed ``n_jobs``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from omegaconf import OmegaConf

from raydp_llm.cli.sweep import records
from raydp_llm.core.errors import InputError

log = logging.getLogger(__name__)
RESULTS_FILE = "optimization_results.yaml"


def space_of(arguments: list[str]) -> tuple[list[str], dict]:
    """The overrides every trial shares, and the search space: setting → Optuna distribution;
    one line for what Hydra or Optuna cannot take."""
    try:
        parsed = OverridesParser.create().parse_overrides(arguments)
    except Exception as err:  # noqa: BLE001 - Hydra's parser says what is wrong, on many lines
        raise InputError(f"hydra/sweeper=optuna: the search space does not parse: "
                         f"{str(err).splitlines()[0]}") from None
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    space = {o.get_key_element(): distribution(o) for o in parsed if o.is_sweep_override()}
    if not space:
        raise InputError("hydra/sweeper=optuna: no setting to search; give one as "
                         "optim.lr=tag(log,interval(1e-4,1e-2)) or model.n_layer=choice(2,4)")
    return fixed, space


def distribution(override: Override):
    """An Optuna distribution of a sweep override: ``interval`` (a float, or an int between ints;
    ``tag(log, ...)`` samples it on a log scale), ``choice`` and ``range`` (categorical)."""
    import optuna.distributions as d

    sweep = override.value()
    if isinstance(sweep, IntervalSweep):
        log_scale = "log" in sweep.tags
        if isinstance(sweep.start, int) and isinstance(sweep.end, int):
            return d.IntDistribution(sweep.start, sweep.end, log=log_scale)
        return d.FloatDistribution(sweep.start, sweep.end, log=log_scale)
    if isinstance(sweep, ChoiceSweep):
        return d.CategoricalDistribution(list(sweep.list))
    if isinstance(sweep, RangeSweep):
        return d.CategoricalDistribution(list(override.sweep_iterator()))
    raise InputError(f"{override.input_line}: not a space Optuna samples; use interval(a,b), "
                     "tag(log,interval(a,b)), choice(a,b,...) or range(a,b)")


def sweep(plugin, arguments: list[str]) -> list:
    """Hydra's ``Sweeper.sweep`` of ``hydra_plugins.raydp_llm_sweep.RaydpOptunaSweeper``."""
    import optuna

    from raydp_llm.cli.sweep.launcher import room

    config = plugin.config
    settings = OmegaConf.to_object(config.sweep)
    fixed, space = space_of(arguments)
    launcher = Plugins.instance().instantiate_launcher(
        hydra_context=plugin.hydra_context, task_function=plugin.task_function, config=config)
    direction = _direction(settings)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=direction,
                                sampler=optuna.samplers.TPESampler(seed=int(config.seed)))
    sweep_dir, returns, asked = Path(str(config.hydra.sweep.dir)), [], 0
    while asked < settings.trials:
        size = room([OmegaConf.to_object(config.train)], settings.max_concurrent,
                    settings.trials - asked)
        trials = [study.ask(space) for _ in range(size)]
        batch = [fixed + [f"{key}={value}" for key, value in t.params.items()] for t in trials]
        log.info("optuna: trials %d-%d of %d", asked, asked + size - 1, settings.trials)
        returns += launcher.launch(batch, initial_job_idx=asked)
        rows = records.rows(sweep_dir)
        for num, trial in enumerate(trials, start=asked):
            _tell(study, trial, rows.get(num), settings.metric)
        asked += size
    _write_results(study, sweep_dir / RESULTS_FILE, str(config.name))
    return returns


def _direction(settings) -> str:
    from raydp_llm.training.driver import best

    mode = settings.mode or best.order(settings.metric)
    return "minimize" if mode == "min" else "maximize"


def _tell(study, trial, row: dict | None, metric: str) -> None:
    """A job's end told to Optuna: its last ``metric`` when it completed, pruned when a scheduler
    stopped it, failed otherwise."""
    from optuna.trial import TrialState

    if row is None or row["status"] == records.FAILED:
        study.tell(trial, state=TrialState.FAIL)
    elif row["status"] == records.STOPPED:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        value = records.last_value(Path(row["output_dir"]), metric)
        study.tell(trial, value, state=None if value is not None else TrialState.FAIL)


def _write_results(study, path: Path, name: str) -> None:
    """``optimization_results.yaml``, as Hydra's Optuna sweeper writes it: the best setting and
    its value (none when no trial completed)."""
    from optuna.trial import TrialState

    done = study.get_trials(states=[TrialState.COMPLETE])
    results = {"name": name, "direction": study.direction.name.lower(),
               "trials": len(study.trials), "completed": len(done)}
    if done:
        results |= {"best_params": study.best_params, "best_value": study.best_value}
        print(f"optuna: best {study.best_params} = {study.best_value:.4f} ({path})", flush=True)
    OmegaConf.save(OmegaConf.create(results), path)
