"""At the door: an entry point turns Hydra's config into typed settings once (every path made
absolute, from where the command ran: Ray's workers and Spark's executors run elsewhere), and checks
them before any engine starts. Past this module no code reads the raw config. It loads no torch,
Ray or Spark unless a check needs them (a checkpoint to read): bad input fails in a second.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import FrozenInstanceError, fields, is_dataclass, replace
from pathlib import Path
from typing import Iterable

from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from raydp_llm.core import storage
from raydp_llm.core.checks import validate
from raydp_llm.core.config import Settings, source_settings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import load_tokenizer
from raydp_llm.data.chat.sample import sample_chat_corpus
from raydp_llm.data.inputs.files import Corpus, check_heads, resolve_corpus
from raydp_llm.data.inputs.tables import is_iceberg
from raydp_llm.data.preference.sample import sample_preference_corpus

RESUME_WORDS = ("auto", "never")


def absolute(path: str) -> str:
    """A path the user gave, relative to where they ran the command; URIs stay as they are."""
    return path if "://" in path else to_absolute_path(path)


def _table(table: str | None, catalog: dict) -> str | None:
    """A Delta table's directory made absolute (its record names it so); an Iceberg table's
    name as given."""
    return table and (table if is_iceberg(table, catalog) else absolute(table))


def typed_settings(cfg: DictConfig, overrides: Iterable[str] | None = None) -> Settings:
    """The composed config as its schema's objects (a model config's own checks run here), with
    absolute paths, and the shape and tokenizer of ``model.init_from``. ``overrides``: the command
    line's (Hydra's, when None), which say what the user gave."""
    try:
        settings = OmegaConf.to_object(cfg)
    except FrozenInstanceError as err:  # ``+key=value`` added a key the schema lacks
        raise InputError(_added_key(cfg, str(err).split("'")[1], overrides)) from None
    data, train, tok, model = settings.data, settings.train, settings.tokenizer, settings.model
    changes = {
        "data": replace(data, path=_absolute_any("data.path", data.path),
                        table=_table(data.table, data.catalog),
                        cache_dir=absolute(data.cache_dir),
                        sources=[replace(s, path=_absolute_any(f"data.sources.{i}.path", s.path),
                                         table=_table(s.table, data.catalog))
                                 for i, s in enumerate(data.sources)]),
        "tokenizer": replace(tok, path=tok.path and absolute(tok.path)),
        "model": _absolute_model(model),
        "train": replace(
            train,
            storage_path=train.storage_path and absolute(train.storage_path),
            resume=train.resume if train.resume in RESUME_WORDS else absolute(train.resume),
            eval_tasks=task_paths(train.eval_tasks),
        ),
    }
    if settings.grpo.rewards:  # the workers import a reward file from elsewhere
        changes["grpo"] = replace(settings.grpo, rewards=[
            _absolute_reward(spec) for spec in settings.grpo.rewards])
    if getattr(settings, "tasks", None):  # evaluate's
        changes["tasks"] = task_paths(settings.tasks)
    for key in ("model_dir", "ref_model_dir"):  # evaluate's
        if getattr(settings, key, None):
            changes[key] = absolute(getattr(settings, key))
    if changes.get("model_dir") and data.pairs:  # evaluate on pairs: the model's DPO tuning
        changes |= _recorded_tuning(changes["model_dir"], changes.get("ref_model_dir"), settings,
                                    given(overrides, "dpo."))
    if getattr(model, "init_from", None):
        changes["model"], changes["tokenizer"] = _init_from(
            replace(model, init_from=absolute(model.init_from)), changes["tokenizer"],
            given(overrides, "model."))
    if model.kind == "hf":
        changes["model"], changes["tokenizer"] = _pretrained(
            changes["model"], changes["tokenizer"], S3Options.of(settings.s3))
    return replace(settings, **changes)


def _absolute_reward(spec: str) -> str:
    """A reward's ``file.py:function`` with the file's absolute path; a module's as it is."""
    place, _, name = spec.rpartition(":")
    return f"{absolute(place)}:{name}" if place.endswith(".py") else spec


def task_paths(tasks: list[str]) -> list[str]:
    """Harness tasks as given, task YAMLs as absolute paths (the workers run elsewhere)."""
    return [absolute(t) if t.endswith((".yaml", ".yml")) else t for t in tasks]


def _recorded_tuning(model_dir: str, ref_model_dir: str | None, settings: Settings,
                     given_keys: set[str]) -> dict:
    """What ``model_dir`` records of its DPO tuning (``layout.PreferenceRecord``) as settings: its
    reference, unless ``ref_model_dir`` was given, and its DPO settings but those the command line
    gave. Nothing for a model that records none."""
    from raydp_llm.checkpoint.layout import PreferenceRecord

    record = PreferenceRecord.read(model_dir, S3Options.of(settings.s3))
    if record is None:
        return {}
    return {"ref_model_dir": ref_model_dir or record.reference,
            "dpo": replace(record.dpo, **{k: getattr(settings.dpo, k) for k in given_keys})}


def _absolute_model(model):
    """The model settings with absolute paths: its token vectors, model=hf's directory."""
    if getattr(model, "init_embeddings", None):
        model = replace(model, init_embeddings=absolute(model.init_embeddings))
    if getattr(model, "path", None):
        model = replace(model, path=absolute(model.path))
    return model


def _pretrained(model, tokenizer, s3: S3Options):
    """model=hf: its directory checked (a decoder, with config and weights), its tokenizer as the
    ETL's (the executors encode with it), and the block size and vocabulary from its config."""
    from raydp_llm.models import files, hf  # transformers: only for a model=hf run

    if not model.path:
        raise InputError("model.path is missing: model=hf trains a Hugging Face directory; add "
                         "model.path=<local directory or s3:// prefix> (+experiment=sums makes a "
                         "small one, outputs/sums/<run>/model)")
    if tokenizer.path:
        raise InputError(f"model=hf brings its tokenizer but tokenizer.path={tokenizer.path} was "
                         "given; drop tokenizer.path")
    config = hf.read_hf_config(model.path, "model.path", s3)
    local = files.tokenizer_dir(model.path, s3)
    try:
        hf_tokenizer = load_tokenizer(local)
    except ValueError as err:
        raise InputError(f"model.path={model.path}: {err}") from None
    return hf.resolved(model, config, hf_tokenizer), replace(tokenizer, path=str(local))


def not_a_setting(key: str, known: Iterable[str]) -> str:
    """The line for ``key``, which no setting has: the nearest setting's name, and how to list
    them."""
    parent, _, name = key.rpartition(".")
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
    hint = f"; did you mean {parent}.{close[0]}?" if close and parent else ""
    listing = f"--cfg job --package {parent} lists {parent}'s" if parent else "--cfg job lists the"
    return (f"{key} is not a setting{hint} ({listing} settings; + adds a key only where free keys "
            "are taken)")


def _added_key(cfg: DictConfig, name: str, overrides: Iterable[str] | None) -> str:
    """The line for a ``+`` override that added ``name`` to a node of the schema."""
    keys = [k for k in given(overrides, "") if k == name or k.endswith(f".{name}")]
    key = keys[0] if keys else name
    parent = OmegaConf.select(cfg, key.rpartition(".")[0]) if "." in key else None
    kind = OmegaConf.get_type(parent) if parent is not None else None
    return not_a_setting(key, [f.name for f in fields(kind)] if is_dataclass(kind) else [])


def given(overrides: Iterable[str] | None, prefix: str) -> set[str]:
    """The keys under ``prefix`` that the command line set (``model.n_layer=2`` → ``n_layer``)."""
    if overrides is None:
        overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    keys = (o.split("=", 1)[0].lstrip("+~") for o in overrides)
    return {k.removeprefix(prefix) for k in keys if k.startswith(prefix)}


def _init_from(model, tokenizer, given: set[str]):
    """The model settings with the shape of the GPT-2 checkpoint ``model.init_from`` (a shape field
    the user also gave must agree; block_size may be shorter), and the tokenizer settings reading
    its tokenizer.json."""
    # torch: only a run that starts from a checkpoint waits for it
    from raydp_llm.models import files, gpt2

    where = model.init_from  # a GPT's setting: the LSTM's schema has none
    shape = gpt2.gpt2_shape(where, gpt2.read_gpt2_config(where), gpt2.read_gpt2_tensors(where))
    for key in sorted(given & shape.keys()):
        mine = getattr(model, key)
        shorter = key == "block_size" and mine <= shape[key]
        if mine != shape[key] and not shorter:
            raise InputError(f"model.init_from={where} has {key}={shape[key]} but model.{key}="
                             f"{mine} was given; drop model.{key}, or give {shape[key]}")
    if "block_size" in given:
        shape["block_size"] = model.block_size  # the first positions of its table
    ids = files.read_hf_tokenizer(where).vocab_size  # it exists and has the end-of-document token
    if ids != shape["vocab_size"]:
        raise InputError(f"model.init_from={where}: {files.TOKENIZER_FILE} has {ids} ids but the "
                         f"model {shape['vocab_size']} token embeddings; give the tokenizer the "
                         "model was trained with")
    vocab = str(Path(where) / files.TOKENIZER_FILE)
    if tokenizer.path not in (None, vocab):
        raise InputError(f"model.init_from={where} brings its tokenizer but tokenizer.path="
                         f"{tokenizer.path} was given; drop tokenizer.path")
    return replace(model, **shape), replace(tokenizer, path=vocab)


def _absolute_any(key: str, path: str | list[str] | None) -> str | list[str] | None:
    """A corpus's path, or list of them, made absolute; an empty one (``data.path=$CORPUS`` with
    the variable unset) is refused: made absolute, it would read the working directory."""
    if path is None:
        return None
    paths = [path] if isinstance(path, str) else list(path)
    if not all(str(p).strip() for p in paths):
        what = "is empty" if isinstance(path, str) else "holds an empty path"
        raise InputError(f"{key}={path!r} {what}: give a file, directory, glob or URI, or null "
                         "for the built-in sample (is a variable in the command unset?)")
    return absolute(path) if isinstance(path, str) else [absolute(p) for p in path]


def check_inputs(settings: Settings) -> Corpus | dict[str, Corpus]:
    """Check the settings (``checks.validate``, the paths that must exist, a checkpoint to resume,
    the storage's bucket) and resolve the corpus (a mixture's: one per source, by name), before
    any engine starts."""
    validate(settings)
    t, d, s3 = settings.train, settings.data, S3Options.of(settings.s3)
    vectors = getattr(settings.model, "init_embeddings", None)
    if vectors and not Path(vectors).is_file():
        raise InputError(f"model.init_embeddings={vectors}: no such file; give a CSV or .npy file "
                         "of token vectors")
    if vectors:  # widths and values now; the ids against the vocabulary after the ETL
        from raydp_llm.models.embeddings import read_embeddings  # torch, as below: only when needed

        read_embeddings(vectors, None, settings.model.n_embd)
    if t.resume not in RESUME_WORDS:
        from raydp_llm.checkpoint.checkpointer import Checkpointer

        Checkpointer.for_run(t, settings.model).check(t.resume, settings.model,
                                                      f"train.resume={t.resume}", s3)
    if t.storage_path and storage.is_s3(t.storage_path):
        storage.check_bucket("train.storage_path", t.storage_path, s3)
    if t.use_gpu and settings.cluster.address == "local" and not local_gpus():
        raise InputError("train.use_gpu=true: this machine has no NVIDIA GPU that Ray would count "
                         "(none in /proc/driver/nvidia/gpus or /dev/nvidia*, or "
                         "CUDA_VISIBLE_DEVICES names none); set train.use_gpu=false, or run on a "
                         "cluster with GPUs (cluster.address=...)")
    if settings.tokenizer.path and not Path(settings.tokenizer.path).exists():
        raise InputError(f"tokenizer.path={settings.tokenizer.path}: no such file; give a "
                         "tokenizer.json")
    tasks = []
    if t.eval_tasks:  # the harness's checks of the tasks (lm-eval loads: only when asked)
        from raydp_llm.training.tasks import task_list

        tasks = task_list(t.eval_tasks).names
    if t.best_by:  # ranked by a column the checkpoints report (ray.train: only when asked)
        from raydp_llm.training.driver import best

        best.check(t.best_by, tasks, [source.name for source in d.sources], t.task_interval)
    if d.sources:  # a mixture: each source's corpus
        return {source.name: corpus_of(source_settings(settings, source))
                for source in d.sources}
    corpus = corpus_of(settings)
    if d.format == "prompts":
        check_prompts(settings, corpus)
    return corpus


def local_gpus() -> int:
    """How many NVIDIA GPUs the embedded Ray would count here, without loading torch or Ray: the
    driver's list (or the device files), cut to ``CUDA_VISIBLE_DEVICES`` when that is set."""
    listed = Path("/proc/driver/nvidia/gpus")
    found = len(list(listed.iterdir())) if listed.is_dir() else \
        len([d for d in Path("/dev").glob("nvidia[0-9]*")])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        found = min(found, len(names))
    return found


def check_prompts(settings: Settings, corpus: Corpus) -> None:
    """Prompts for GRPO: the first file's columns (local JSON Lines or Parquet; others are read by
    Spark) hold a prompt or messages column, and each reward function is found and takes the
    columns it asks for."""
    from raydp_llm.data.prompts.columns import first_columns
    from raydp_llm.training.objectives.rewards import load

    d = settings.data
    columns = first_columns(corpus.files[0]) if corpus.files else None
    if columns is not None and not {d.prompt_column, d.messages_column} & columns:
        raise InputError(f"data.prompt_column={d.prompt_column}: no such column in "
                         f"{corpus.files[0]}, nor data.messages_column={d.messages_column}; its "
                         f"columns are {', '.join(sorted(columns))}; name the prompt's column "
                         "with one of them")
    load(settings.grpo.rewards,  # prompts train only with grpo (checks.validate)
         None if columns is None else columns - {d.prompt_column, d.messages_column})


def table_corpus(settings: Settings) -> Corpus:
    """``data.table``'s snapshot (or what was appended to it) as the corpus, its settings checked
    first (data/inputs/tables.py)."""
    from raydp_llm.data.inputs.tables import table_corpus as of_table

    model = settings.model
    model_dir = getattr(model, "path", None) or getattr(model, "init_from", None)
    return of_table(settings.data, S3Options.of(settings.s3), model_dir)


def corpus_of(settings: Settings) -> Corpus:
    """The corpus ``data.*`` names: its files listed (fingerprinted), or none yet for a query."""
    d, s3 = settings.data, S3Options.of(settings.s3)
    if d.table is not None:
        return table_corpus(settings)
    if d.query is not None:  # its input files are known once Spark plans it (data/inputs/query.py)
        return Corpus(files=[], markdown=False, name="query")
    if d.path is None and d.pairs:  # the sample preference pairs
        corpus = sample_preference_corpus()
    elif d.path is None and d.chat:  # the sample conversations
        corpus = sample_chat_corpus()
    else:
        corpus = resolve_corpus(d.path, markdown=d.markdown, s3=s3)
    if d.max_files:
        corpus = Corpus(
            files=corpus.files[: d.max_files],
            markdown=corpus.markdown,
            name=corpus.name,
            fingerprints=corpus.fingerprints[: d.max_files],
        )
    if d.format in ("text", "ids", "jsonl"):  # the ETL's checks of lines, on a sample's start
        check_heads(corpus.files, d.skip_binary)
    return corpus
