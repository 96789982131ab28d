"""The command line composed before Hydra runs it (Hydra's Compose API), so that what Hydra refuses
is the project's one line and exit status 2 (an unknown key, ``+`` on a key that is there, the
override grammar, an unknown option of a config group), still saying what Hydra said. With ``-m``,
each job of the grid is composed and checked as a single run's settings are, and a sweep none of
whose jobs could run (a typo every job shares: ``sweep.scheduler=ashaa``) is refused before Ray
starts; a job of its own that fails stays that job's failed row (cli/sweep/summary.py). And
``-m --cfg job`` prints each job's config, which Hydra refuses to do."""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf

from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.registry import CONF_DIR

MULTIRUN = ("-m", "--multirun")
MAX_JOBS = 64  # the grid's jobs composed and checked at most (a job takes ~30 ms)
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"
HYDRA_ERRORS = (ConfigCompositionException, MissingConfigException, OverrideParseException)
PRINTING = {"--cfg": "part", "-c": "part", "--package": "package", "-p": "package"}


@dataclass(frozen=True)
class CommandLine:
    """The arguments as Hydra reads them: the overrides, ``-m``, and Hydra's other flags (with
    their values, as given)."""

    overrides: list[str]
    multirun: bool
    flags: list[str]

    @classmethod
    def of(cls, argv: list[str]) -> CommandLine:
        flags, overrides, takes_value = [], [], False
        for arg in argv:
            if takes_value or arg.startswith("-"):
                flags.append(arg)
                takes_value = arg in ("--cfg", "-c", "--package", "-p")
            else:
                overrides.append(arg)
        multirun = any(f in MULTIRUN for f in flags)
        return cls(overrides, multirun, [f for f in flags if f not in MULTIRUN])

    def printed_config(self) -> dict | None:
        """``--cfg``'s part, ``--package``'s and ``--resolve``, when these are the only flags."""
        flags = [f for f in self.flags if f != "--resolve"]
        names, values = flags[::2], flags[1::2]
        if not {"--cfg", "-c"} & set(names) or set(names) - set(PRINTING):
            return None
        return {"part": "job", "package": ""} | {PRINTING[n]: v for n, v in zip(names, values)} \
            | {"resolve": "--resolve" in self.flags}


def preflight(config_name: str, argv: list[str] | None = None) -> None:
    """Before ``hydra.main``: compose the command line as Hydra will; what Hydra would refuse is
    one line on stderr and exit status 2. ``-m``: each job composed and checked; a sweep whose
    every job fails is refused; with ``--cfg``, each job's config printed (then exit 0). Any other
    flag (``--help``, ``--cfg`` of a single run, ``--info``): Hydra's own handling."""
    line = CommandLine.of(sys.argv[1:] if argv is None else argv)
    printed = line.printed_config() if line.multirun else None
    if line.flags and not printed:
        return
    try:
        if printed:
            print_jobs(config_name, jobs(line.overrides), **printed)
        elif line.multirun:
            check_jobs(config_name, jobs(line.overrides))
        else:
            compose(config_name, line.overrides)
    except InputError as err:
        _refuse(str(err))
    except HYDRA_ERRORS as err:
        _refuse(hydra_line(err, config_name, line.overrides))
    except Exception:  # noqa: BLE001 - not a refusal: Hydra's own run reports it as it does
        return
    if printed:
        sys.exit(0)


def _refuse(line: str) -> None:
    print(f"error: {line}", file=sys.stderr)
    sys.exit(2)


def jobs(overrides: list[str]) -> list[list[str]]:
    """The grid's jobs as Hydra 1.3.8's basic sweeper makes them (``BasicSweeper.split_arguments``:
    one list of values per key, the last given winning, in the keys' first order; their product),
    its first ``MAX_JOBS``; a sweep no grid takes (Optuna's ``interval``) left at its default."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, by_key = OverridesParser.create(), {}
    for text in overrides:
        override = parser.parse_override(text)  # a grammar error names this one
        key = override.get_key_element()
        if not override.is_sweep_override():
            by_key[key] = [text]
        elif override.is_discrete_sweep():
            by_key[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:  # Optuna's sweeper samples it
            by_key.pop(key, None)
    return [list(job) for job in itertools.islice(itertools.product(*by_key.values()), MAX_JOBS)]


def compose(config_name: str, overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """The config as Hydra composes it for a run with ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides,
                             return_hydra_config=with_hydra)


def check_jobs(config_name: str, grid: list[list[str]]) -> None:
    """Each job's settings through the sweep's metric check and the single run's checks
    (``typed_settings``, ``validate``): when none passes, ``InputError`` with the first job's
    reason."""
    from raydp_llm.cli.inputs import typed_settings
    from raydp_llm.cli.sweep.summary import check_metric
    from raydp_llm.core.checks import validate

    first = None
    for job in grid:
        try:
            cfg = compose(config_name, job)
            check_metric(cfg)  # the sweep's own: what ranks the jobs
            validate(typed_settings(cfg, job))
            return
        except (InputError, *HYDRA_ERRORS) as err:
            first = first or err
    if first is None:  # no job to check
        return
    if not isinstance(first, InputError):
        raise first
    raise InputError(f"{first} (in every job of the sweep: refused before Ray starts)")


def print_jobs(config_name: str, grid: list[list[str]], part: str = "job", package: str = "",
               resolve: bool = False) -> None:
    """``--cfg part`` for each job, under a comment line naming it: Hydra prints no sweep's."""
    for number, job in enumerate(grid):
        cfg = compose(config_name, job, with_hydra=part != "job")
        node = cfg.hydra if part == "hydra" else cfg
        if package:
            node = OmegaConf.select(node, package)
        print(f"# job {number}: {' '.join(job)}")
        print(OmegaConf.to_yaml(node, resolve=resolve), end="")


def hydra_line(err: BaseException, config_name: str, overrides: list[str]) -> str:
    """Hydra's refusal as one line: what, and what to do."""
    cause = err.__cause__ or err
    text = str(err)
    if isinstance(cause, OverrideParseException) or isinstance(err, OverrideParseException):
        bad = next((o for o in overrides if not _parses(o)), "the command line")
        return (f"{bad}: Hydra's override grammar refuses it ({first_line(text)}); quote a value "
                f"that holds special characters: '{_quoted(bad)}' ({GRAMMAR})")
    if isinstance(cause, MissingConfigException) or isinstance(err, MissingConfigException):
        listed = text.partition("Available options in")[2].partition("Config search path")[0]
        options = [line.strip() for line in listed.splitlines()[1:] if line.strip()]
        return first_line(text) + (f"; the options: {', '.join(options)}" if options else "")
    if text.startswith("Could not override '") and str(cause).startswith("Key '"):
        key = text.split("'")[1]
        return _unknown_key(key, config_name, overrides)
    said = [line.strip().rstrip(".") for line in text.splitlines() if line.strip()]  # its hints
    if cause is not err:
        said.append(first_line(cause))
    return "; ".join(said)


def _unknown_key(key: str, config_name: str, overrides: list[str]) -> str:
    """``not_a_setting``, with the settings of the node ``key`` would be in (composed without
    it)."""
    from raydp_llm.cli.inputs import not_a_setting

    known: list[str] = []
    try:
        others = [o for o in overrides if o.split("=")[0].lstrip("+~") != key]
        node = OmegaConf.select(compose(config_name, others), key.rpartition(".")[0])
        known = list(node.keys()) if isinstance(node, DictConfig) else []
    except Exception:  # noqa: BLE001 - the hint only: the line stands without it
        pass
    return not_a_setting(key, known)


def _parses(text: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_override(text)
        return True
    except Exception:  # noqa: BLE001 - Hydra's grammar refused it
        return False


def _quoted(override: str) -> str:
    key, sep, value = override.partition("=")
    return f'{key}{sep}"{value}"' if sep else override
