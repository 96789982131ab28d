"""Benchmark tasks through lm-evaluation-harness (its Python API, ``simple_evaluate``), offline:
``python -m raydp_llm.evaluate model_dir=DIR tasks=[NAME,...]``, and ``train.eval_tasks`` at a
run's checkpoints (the same code on the checkpoint's directory).

The harness reads a Hugging Face directory: a transformers model's ``model/`` as it is, the own
GPT's through its GPT-2 export (written into the run directory, no step for the user). A task is a
harness task by name, or a task YAML of the user's (its ``dataset_path: json`` or ``parquet`` with
``data_files`` local or on S3, fetched first: ``task_files``). The harness runs offline
(``HF_DATASETS_OFFLINE``, ``HF_HUB_OFFLINE``): a task whose data is neither local nor cached is one
line, never a wait on the network. Prints a line per task and metric (``task NAME METRIC VALUE``);
``evaluation.json`` holds them and the harness's own results.
"""

from __future__ import annotations

import atexit
import difflib
import functools
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.storage import S3Options
from raydp_llm.models.files import is_hf_dir
from raydp_llm.training.task_files import localized

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
LEFT_OUT = ("alias", "name", "sample_len", " ")  # the harness's result keys that are no metric


class _TolerantLoader(yaml.SafeLoader):
    """YAML as the harness's task files are written: its tags (``!function module.fn``) read as
    nothing, since only the task's name is needed here."""


_TolerantLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


@dataclass(frozen=True)
class TaskList:
    """The harness's names of the tasks asked for, and its task index (the user's task YAMLs'
    folders in it; the harness's own tasks only when one is asked for by name)."""

    names: list[str]
    manager: object


def task_list(given: list[str]) -> TaskList:
    """Each of ``given``: a task YAML (a path ending in .yaml or .yml: its ``task`` name, its
    folder searched), or a harness task, checked against the harness's index (one line naming the
    nearest names)."""
    names, folders, by_name = [], set(), []
    for task in given:
        if task.endswith((".yaml", ".yml")):
            names.append(yaml_task(Path(task)))
            folders.add(str(Path(task).resolve().parent))
        else:
            names.append(task)
            by_name.append(task)
    offline()
    from lm_eval.tasks import TaskManager

    # indexing the harness's own ~15,000 tasks takes seconds: only when one is named
    manager = TaskManager(include_path=sorted(folders) or None, include_defaults=bool(by_name))
    for task in by_name:
        if task not in manager.all_tasks:
            near = difflib.get_close_matches(task, manager.all_tasks, n=5)
            raise InputError(f"tasks: {task} is not a task of lm-evaluation-harness"
                             f"{' (nearest: ' + ', '.join(near) + ')' if near else ''}; give a "
                             "harness task's name or the path of a task YAML")
    return TaskList(names, manager)


@functools.lru_cache(maxsize=4)
def indexed(given: tuple[str, ...], s3: S3Options = S3Options()) -> TaskList:
    """``task_list``, made once per process for the same tasks: a run scores them at every
    checkpoint, and indexing the harness's own tasks takes seconds each time. A task YAML's
    ``s3://`` data is fetched then, into the process's scratch directory (``task_files``)."""
    return task_list(localized(list(given), s3, scratch()))


@functools.cache
def scratch() -> Path:
    """This process's directory for task data fetched from S3, removed at its exit."""
    path = Path(tempfile.mkdtemp(prefix="raydp_llm_tasks_"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def offline() -> None:
    """The harness and the datasets it loads never reach for the network: the flags set before
    they are read, and in their modules where one is loaded already (transformers loads the
    hub's)."""
    os.environ.update(OFFLINE)
    for module, flags in (("datasets.config", OFFLINE), ("huggingface_hub.constants",
                                                         ["HF_HUB_OFFLINE"])):
        for flag in flags if module in sys.modules else ():
            setattr(sys.modules[module], flag, True)


def yaml_task(path: Path) -> str:
    """A task YAML's ``task`` name; one line (file and line) when it does not parse."""
    if not path.is_file():
        raise InputError(f"tasks: {path}: no such file; give a task YAML (lm-evaluation-harness's "
                         "format) or a harness task's name")
    try:
        content = yaml.load(path.read_text(), Loader=_TolerantLoader)  # noqa: S506 - safe + tags
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = first_line(getattr(err, "problem", None) or err, 80)
        raise InputError(f"tasks: {where}: the task YAML does not parse ({problem}); fix "
                         "it") from None
    if not isinstance(content, dict) or not isinstance(content.get("task"), str):
        raise InputError(f"tasks: {path}: no `task: NAME` in it; a task YAML names its task")
    return content["task"]


def harness_dir(model_dir: Path, out_dir: Path) -> Path:
    """The Hugging Face directory the harness reads: ``model_dir`` itself, or the own GPT's
    GPT-2 export in ``out_dir/hf_model``."""
    if is_hf_dir(model_dir):
        return model_dir
    from raydp_llm.checkpoint.model_dir import load_model_dir
    from raydp_llm.models.files import NotExpressible
    from raydp_llm.models.gpt2 import check_exportable, save_gpt2_dir

    model, tokenizer = load_model_dir(model_dir)
    try:
        check_exportable(model)
    except NotExpressible as err:
        raise InputError(f"tasks: {model_dir}: {err}") from None
    if tokenizer.kind == "ids":
        raise InputError(f"tasks: {model_dir} reads token ids, not text; the harness's tasks are "
                         "text")
    return save_gpt2_dir(out_dir / "hf_model", model, tokenizer)


@dataclass(frozen=True)
class HarnessSettings:
    """How the harness runs: shots per prompt (None: each task's own), documents per task (None:
    all; below 1: a fraction), its batch size and seed."""

    num_fewshot: int | None = None
    limit: float | None = None
    batch_size: int = 8
    seed: int = 1337


def run_tasks(given: list[str], model_dir: Path, out_dir: Path,
              harness: HarnessSettings = HarnessSettings(), s3: S3Options = S3Options()) -> dict:
    """The harness on ``model_dir`` for the tasks ``given`` (``s3`` reaching their YAMLs'
    ``s3://`` data): ``{task: {metric: value}}`` (``tasks``) and the harness's results
    (``harness``)."""
    tasks = indexed(tuple(given), s3)
    directory = harness_dir(model_dir, out_dir)
    from lm_eval import simple_evaluate

    seed = harness.seed
    try:
        out = simple_evaluate(
            model="hf", model_args=f"pretrained={directory},dtype=float32", tasks=tasks.names,
            num_fewshot=harness.num_fewshot, limit=harness.limit, batch_size=harness.batch_size,
            task_manager=tasks.manager, device="cuda" if torch.cuda.is_available() else "cpu",
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
            fewshot_random_seed=seed)
    except Exception as err:  # noqa: BLE001 - the data the harness could not reach: one line
        raise unreachable_data(err, tasks) or err
    scores = {task: {metric.split(",")[0]: value for metric, value in found.items()
                     if not metric.startswith(LEFT_OUT) and "_stderr" not in metric
                     and isinstance(value, (int, float))}
              for task, found in out["results"].items()}
    return {"tasks": scores, "harness": json.loads(json.dumps(
        {k: out.get(k) for k in ("results", "configs", "versions", "n-shot", "n-samples")},
        default=str))}


def columns(scores: dict) -> dict:
    """Task scores as ``metrics.csv`` columns: ``task_<task>_<metric>``."""
    return {f"task_{task}_{metric}": value
            for task, metrics in scores.items() for metric, value in metrics.items()}


def unreachable_data(err: Exception, tasks: TaskList) -> InputError | None:
    """One line for a task whose data is neither local nor cached (offline), or None."""
    text = f"{type(err).__name__}: {err}"
    offline = ("offline" in text.lower() or "Couldn't reach" in text
               or isinstance(err, (ConnectionError, FileNotFoundError)))
    if not offline:
        return None
    return InputError(f"tasks: {', '.join(tasks.names)}: a task's data is neither local nor "
                      f"cached, and evaluate runs offline ({first_line(err, 120)}); give a task "
                      "YAML whose dataset_path (json, parquet) and data_files point at local "
                      "files, or copy the dataset into the Hugging Face cache "
                      "(HF_DATASETS_CACHE)")


def show_tasks(model_dir: str, scores: dict, out_dir: Path) -> None:
    """A line per task and metric: ``task NAME METRIC VALUE``."""
    print(f"{model_dir}: lm-evaluation-harness; evaluation.json in {out_dir}")
    for task, metrics in scores.items():
        for metric, value in metrics.items():
            print(f"task {task} {metric} {value:.4f}")
