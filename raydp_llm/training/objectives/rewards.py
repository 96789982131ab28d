"""The reward functions of learning from rewards (``grpo.rewards``): the user's own Python, found
and checked before any engine starts (``load``), and called apart from the training process, each
batch within ``grpo.reward_timeout_s`` (``RewardCalls``).

A reward has TRL's signature: ``function(prompts, completions, **columns) -> list[float | None]``,
``prompts`` and ``completions`` the texts, each other column of the data a list by its name, one
entry per completion. It is named ``'path/to/file.py:function'``, ``'package.module:function'``,
or by a shipped function's name alone (``SHIPPED``). A call that raises, hangs or returns what is
not one number (or None) per completion scores None for its batch: a reward failure, never a hung
or crashed step. The process the calls run in is started again after a hang.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import multiprocessing
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from raydp_llm.core.errors import InputError, first_line

TEXTS = ("prompts", "completions")  # the two arguments every reward takes first
START_S = 300  # the most the rewards' process may take to start and import the rewards


# ---------------------------------------------------------------------------- shipped rewards
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def exact_match(prompts, completions, answer, **_) -> list[float]:
    """1 where the completion, stripped, is the ``answer`` column's value, else 0."""
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


def last_number(prompts, completions, answer, **_) -> list[float]:
    """1 where the completion's last number is the answer's (after GSM8K's ``####`` if it has
    one, else its last number), else 0."""
    def last(text: str) -> float | None:
        found = NUMBER.findall(str(text).split("####")[-1])
        return float(found[-1].replace(",", "")) if found else None

    return [float(last(c) is not None and last(c) == last(a))
            for c, a in zip(completions, answer)]


TAGGED = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def tagged_format(prompts, completions, **_) -> list[float]:
    """1 where the completion is ``<think>...</think><answer>...</answer>`` and nothing more."""
    return [float(bool(TAGGED.match(c))) for c in completions]


SHIPPED: dict[str, Callable] = {f.__name__: f for f in (exact_match, last_number, tagged_format)}


# ---------------------------------------------------------------------------- finding them
@dataclass(frozen=True)
class Reward:
    """A reward function as ``grpo.rewards`` names it (``spec``); ``name`` labels its metrics
    (``reward_<name>``)."""

    spec: str
    name: str


def resolve(spec: str) -> Callable:
    """The function ``spec`` names, or an ``InputError`` line saying what is missing."""
    if spec in SHIPPED:
        return SHIPPED[spec]
    place, _, name = spec.rpartition(":")
    if not place or not name:
        raise InputError(f"grpo.rewards: {spec!r} names no function: give 'path/to/file.py:"
                         f"function', 'package.module:function' or one of {sorted(SHIPPED)}")
    module = _module(place, spec)
    function = getattr(module, name, None)
    if not callable(function):
        raise InputError(f"grpo.rewards: {place} has no function {name!r} ({spec}): define it "
                         "there or fix the name")
    return function


def _module(place: str, spec: str):
    if place.endswith(".py"):
        path = Path(place).expanduser().resolve()
        if not path.is_file():
            raise InputError(f"grpo.rewards: the file {path} does not exist ({spec}): give the "
                             "path of the Python file that defines the reward")
        found = importlib.util.spec_from_file_location(f"raydp_llm_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(found)
        try:
            found.loader.exec_module(module)
        except SyntaxError as err:  # the line that Python could not read, not a traceback
            raise InputError(f"grpo.rewards: {path}:{err.lineno}: {err.msg} ({spec}): fix the "
                             "file") from None
        except Exception as err:  # noqa: BLE001 - the file's own code failed as it was imported
            raise InputError(f"grpo.rewards: importing {path} failed ({spec}): "
                             f"{first_line(err, with_type=True)}") from err
        return module
    try:
        return importlib.import_module(place)
    except ImportError as err:
        raise InputError(f"grpo.rewards: the module {place} cannot be imported ({spec}): "
                         f"{first_line(err)}") from err


def load(specs: list[str], columns: set[str] | None) -> list[Reward]:
    """Each of ``grpo.rewards`` found, and its parameters checked against the data's ``columns``
    (one ``InputError`` line for the first that fails): it takes prompts and completions first,
    and every other parameter without a default is a column the data has (not checked with
    None: a worker's, once the door has)."""
    if not specs:
        raise InputError("grpo.rewards is empty: train.objective=grpo needs at least one reward, "
                         f"e.g. grpo.rewards=[last_number] (shipped: {sorted(SHIPPED)})")
    rewards = []
    for spec in specs:
        function = resolve(spec)
        if columns is not None:
            _check_parameters(function, spec, columns)
        rewards.append(Reward(spec, function.__name__))
    return rewards


def _takes_any_column(params) -> bool:
    """Whether a signature's ``params`` take ``**columns``."""
    return any(p.kind == p.VAR_KEYWORD for p in params.values())


def _check_parameters(function: Callable, spec: str, columns: set[str]) -> None:
    """Called as TRL calls it, by keyword: ``prompts=``, ``completions=``, and the columns."""
    params = inspect.signature(function).parameters
    if not _takes_any_column(params) and not set(TEXTS) <= set(params):
        raise InputError(f"grpo.rewards: {spec} must take (prompts, completions, **columns); it "
                         f"takes ({', '.join(params)})")
    wanted = [name for name, p in params.items() if name not in TEXTS and p.default is p.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    missing = [name for name in wanted if name not in columns]
    if missing:
        raise InputError(f"grpo.rewards: {spec} asks for the column {missing[0]!r}, which the "
                         f"data lacks (it has {sorted(columns)}): add it or give it a default")


def call(function: Callable, prompts: list[str], completions: list[str],
         columns: dict[str, list]) -> list:
    """``function`` called as TRL calls it: by keyword, with the columns it takes (all of them
    if it takes ``**columns``)."""
    params = inspect.signature(function).parameters
    if not _takes_any_column(params):
        columns = {k: v for k, v in columns.items() if k in params}
    return list(function(prompts=prompts, completions=completions, **columns))


# ---------------------------------------------------------------------------- calling them
def _serve(connection, specs: tuple[str, ...]) -> None:
    """The rewards' process: finds ``specs`` (their imports are its start, not a call's time),
    says it is ready, then calls a function for each request until the pipe closes."""
    functions: dict[str, Callable] = {}
    for spec in specs:
        try:
            functions[spec] = resolve(spec)
        except BaseException:  # noqa: BLE001 - its calls say why, each its batch's failure
            pass
    connection.send(("ready", None))
    while True:
        try:
            spec, prompts, completions, columns = connection.recv()
        except EOFError:
            return
        try:
            function = functions.get(spec) or functions.setdefault(spec, resolve(spec))
            connection.send(("ok", call(function, prompts, completions, columns)))
        except BaseException as err:  # noqa: BLE001 - the user's code: any error is its batch's
            connection.send(("error", first_line(err, 200, with_type=True)))


@dataclass(frozen=True)
class Scores:
    """One function's scores of a batch: a number or None per completion; ``error`` when the
    whole batch failed (it raised, hung, or returned something else)."""

    values: list[float | None]
    error: str | None = None


class RewardCalls:
    """The reward functions' process (spawned: it shares nothing with training's threads), and
    each call to it bounded by ``timeout_s``. A hung call ends that process; the next call starts
    a fresh one. The process's start (Python's, and importing ``specs``) is not counted in a
    call's time: on a busy machine it alone took over 2 s (CI, 2 cores), which failed a fast
    reward's batches as hung."""

    def __init__(self, timeout_s: float, specs: tuple[str, ...] = ()):
        self.timeout_s, self.specs = timeout_s, tuple(specs)
        self.process = self.connection = None

    def score(self, spec: str, prompts: list[str], completions: list[str],
              columns: dict[str, list]) -> Scores:
        try:
            if self.process is None or not self.process.is_alive():
                self._start()
            self.connection.send((spec, prompts, completions, columns))
            if not self.connection.poll(self.timeout_s):
                self.close()
                return _failed(len(completions), f"no answer within {self.timeout_s:g}s")
            status, got = self.connection.recv()
        except (EOFError, OSError):  # the process ended under the call (os._exit, a crash)
            self.close()
            return _failed(len(completions), "the rewards' process ended during the call")
        except TimeoutError as err:
            self.close()
            return _failed(len(completions), str(err))
        if status != "ok":
            return _failed(len(completions), got)
        return _checked(got, len(completions))

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs, self.specs), daemon=True,
                                       name="raydp_llm-rewards")
        self.process.start()
        theirs.close()
        if not self.connection.poll(START_S):
            raise TimeoutError(f"the rewards' process did not start within {START_S}s")
        self.connection.recv()  # ("ready", None)

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.connection.close()
            self.process = self.connection = None


def _failed(n: int, error: str) -> Scores:
    return Scores([None] * n, error)


def _checked(values: list, n: int) -> Scores:
    """What a function returned, if it is one number or None per completion."""
    if len(values) != n:
        return _failed(n, f"returned {len(values)} scores for {n} completions")
    bad = [v for v in values if v is not None and not isinstance(v, (int, float))]
    if bad:
        return _failed(n, f"returned {bad[0]!r}: give a float or None per completion")
    return Scores([None if v is None else float(v) for v in values])


class FailureStreak:
    """Steps in a row each reward failed on every batch: past ``limit`` the run stops, with one
    line naming the function."""

    def __init__(self, rewards: list[Reward], limit: int):
        self.limit, self.counts = limit, {r.spec: 0 for r in rewards}

    def step(self, failed_everywhere: dict[str, str | None]) -> None:
        """After a step: per spec, the error of a function that failed on every batch (else
        None)."""
        for spec, error in failed_everywhere.items():
            self.counts[spec] = self.counts[spec] + 1 if error else 0
            if self.counts[spec] >= self.limit:
                raise InputError(f"grpo.rewards: {spec} failed on every batch of {self.limit} "
                                 f"steps in a row ({error}): fix it, or raise "
                                 "grpo.reward_timeout_s if it is slow")

