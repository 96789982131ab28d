"""``validate``: the settings' checks, before Ray or Spark start. Each field's own check sits beside
it in the schema (core/config.py, ``setting(..., check=...)``); here are those that span settings:
the required settings, pairs that must agree, and the CPUs the job needs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from raydp_llm.core.config import (
    DEFAULT_CHECKPOINT_STEPS,
    ClusterSettings,
    DataSettings,
    FilterSettings,
    Settings,
    TrainSettings,
    source_settings,
)
from raydp_llm.core.errors import InputError
from raydp_llm.core.schema import check_fields


def select(settings: Settings, key: str, default: Any = None) -> Any:
    """The setting at a dotted ``key`` (``train.num_workers``), or ``default`` when the settings
    have none."""
    node: Any = settings
    for part in key.split("."):
        if not hasattr(node, part):
            return default
        node = getattr(node, part)
    return node


def validate(settings: Settings) -> None:
    """Raise ``InputError`` (key, bad value, what is allowed) for the first required setting not
    given, the first setting that fails its check, the first pair that disagrees, or a cluster too
    small for the job. Needs no engine: runs before Ray or Spark start."""
    for key in settings.required:
        if select(settings, key) is None:
            raise InputError(f"{key} is missing: the {settings.name} configuration needs it; add "
                             f"{key}=...")
    check_fields(settings)
    t, o, c = settings.train, settings.optim, settings.cluster
    if o.min_lr is not None and o.min_lr > o.lr:
        raise InputError(f"optim.min_lr={o.min_lr} is above optim.lr={o.lr}; the decay ends at "
                         "min_lr ≤ lr: lower optim.min_lr, or set it to null (lr / 10, at most "
                         "1e-4)")
    _check_batch(t)
    _check_blocks(settings)
    _check_score_filter(settings.data.filters)
    _check_chat(settings)
    _check_objective(settings)
    _check_query(settings.data)
    _check_sources(settings)
    _check_tasks(settings)
    if settings.model.block_size > settings.data.halo_tokens:
        raise InputError(f"model.block_size={settings.model.block_size} is above "
                         f"data.halo_tokens={settings.data.halo_tokens}, the longest window the "
                         "ETL output serves; set data.halo_tokens to at least the block size")
    _check_checkpoints(t)
    # a joined cluster's CPUs are known once it is reached (engines/preflight.py, which counts a
    # Spark kept for the next job too: the embedded Ray a job starts has room for it, as it counts
    # the workers' CPUs twice, ray_cluster.embedded_cpus)
    if c.address == "local":
        cpus = c.num_cpus or os.cpu_count()
        need, formula = cpus_needed(c, t)
        if need > cpus:
            raise InputError(f"the embedded Ray has {cpus:g} CPUs (cluster.num_cpus) but the job "
                             f"needs {need:g}: {formula}; lower them")


def _check_checkpoints(t: TrainSettings) -> None:
    """Checkpoints are taken at evaluations: a given ``checkpoint_interval`` is a multiple of
    ``eval_interval`` (null follows it: ``TrainSettings.checkpoint_every``)."""
    given = t.checkpoint_interval
    if given is None or given % t.eval_interval == 0:
        return
    raise InputError(f"train.checkpoint_interval={given} is not a multiple of "
                     f"train.eval_interval={t.eval_interval}; checkpoints are taken at "
                     f"evaluations: set train.checkpoint_interval to a multiple of "
                     f"{t.eval_interval} (e.g. {_multiples_near(given, t.eval_interval)}), or to "
                     f"null (the evaluation nearest {DEFAULT_CHECKPOINT_STEPS} steps)")


def _check_blocks(settings: Settings) -> None:
    """Sharding and activation checkpointing work block by block: the LSTM has none."""
    t = settings.train
    asked = {"train.strategy=fsdp": t.strategy == "fsdp",
             "train.activation_checkpointing=true": t.activation_checkpointing}
    for setting, on in asked.items():
        if on and settings.model.kind == "lstm":
            raise InputError(f"{setting} works on a transformer's blocks and model=lstm has none; "
                             "use train.strategy=ddp and train.activation_checkpointing=false, or "
                             "a transformer (model=gpt, model=llama, model=hf)")


def _check_chat(settings: Settings) -> None:
    """A chat window is a record of packed conversations (random offsets would cut them), each
    attending only to itself: a recurrence carries its state from one to the next."""
    d = settings.data
    if d.chat and d.sampling == "random":
        raise InputError("data.sampling=random: data.format=chat cuts a window per record of "
                         "packed conversations, never at random offsets; set "
                         "data.sampling=stride")
    if d.chat and not d.pairs and d.packing and settings.model.kind == "lstm":
        raise InputError("data.packing=true packs conversations that model=lstm would read as one "
                         "(its state crosses them); set data.packing=false (one conversation per "
                         "window) or use a transformer (model=gpt, model=llama, model=hf)")


def _check_objective(settings: Settings) -> None:
    """DPO trains on preference pairs, and preference pairs train only with DPO."""
    objective, fmt = settings.train.objective, settings.data.format
    if objective == "dpo" and fmt != "preference":
        raise InputError(f"train.objective=dpo needs preference pairs and data.format={fmt} has "
                         "none; set data.format=preference (rows of prompt, chosen, rejected), "
                         "or train.objective=lm")
    if fmt == "preference" and objective != "dpo":
        raise InputError(f"data.format=preference: train.objective={objective} does not train on "
                         "pairs; set train.objective=dpo (or +experiment=dpo)")
    if objective == "grpo" and fmt != "prompts":
        raise InputError(f"train.objective=grpo answers prompts and data.format={fmt} has none; "
                         "set data.format=prompts (rows with a prompt or messages column)")
    if fmt == "prompts" and objective != "grpo":
        raise InputError(f"data.format=prompts: train.objective={objective} does not learn from "
                         "prompts; set train.objective=grpo (or +experiment=grpo)")
    if objective == "grpo":
        _check_grpo(settings)
    if fmt == "prompts" and settings.data.path is None and settings.data.query is None:
        raise InputError("data.format=prompts needs prompts: give data.path (JSON Lines or "
                         "Parquet files) or data.query (+experiment=grpo ships sample sums)")


def _check_grpo(settings: Settings) -> None:
    """What learning from rewards needs beyond its own fields: the model's own tokenizer (a
    prompt is answered in the model's tokens), room for an answer in the block, a weight per
    reward."""
    g, model = settings.grpo, settings.model
    if not settings.tokenizer.path:
        raise InputError("train.objective=grpo answers with the model's own tokenizer: give "
                         "model=hf model.path=DIR, or tokenizer.path (a finished run's "
                         "model/tokenizer.json) with model.init_from")
    if g.max_new_tokens >= model.block_size:
        raise InputError(f"grpo.max_new_tokens={g.max_new_tokens} leaves no room for a prompt in "
                         f"model.block_size={model.block_size}; lower it or raise the block")
    if g.reward_weights is not None and len(g.reward_weights) != len(g.rewards):
        raise InputError(f"grpo.reward_weights has {len(g.reward_weights)} weights for "
                         f"{len(g.rewards)} grpo.rewards; give one per reward, or null (1 each)")


def _check_score_filter(f: FilterSettings) -> None:
    """The score filter needs its file and exactly one bound."""
    bounds = [name for name in ("max_score", "max_score_quantile") if getattr(f, name) is not None]
    if f.score_path is None and bounds:
        raise InputError(f"data.filters.{bounds[0]} needs data.filters.score_path: give the "
                         "document_scores.parquet of python -m raydp_llm.evaluate "
                         "per_document=true")
    if f.score_path is not None and len(bounds) != 1:
        raise InputError("data.filters.score_path needs one of data.filters.max_score (a mean "
                         "loss) or data.filters.max_score_quantile (a quantile in (0, 1])")
    if f.score_path is not None and "://" not in f.score_path and not Path(f.score_path).exists():
        raise InputError(f"data.filters.score_path={f.score_path}: no such file; give the "
                         "document_scores.parquet of python -m raydp_llm.evaluate "
                         "per_document=true")


QUERY_FORMATS = ("sql", "chat")  # the formats whose rows data.query may give


def _check_query(d: DataSettings) -> None:
    """``data.query`` goes with the formats that read it, and ``data.format=sql`` needs one."""
    if d.query is not None and d.format not in QUERY_FORMATS:
        raise InputError(f"data.query is set but data.format={d.format} reads data.path's files; "
                         "use data.format=sql (or chat) for a query, or drop data.query")
    if d.format == "sql" and not (d.query or "").strip():
        raise InputError("data.format=sql needs data.query: add data.query=\"SELECT text FROM "
                         "...\" (a Spark SQL query whose rows are the documents)")


def _check_tasks(settings: Settings) -> None:
    """``train.eval_tasks`` are scored at checkpoints."""
    t = settings.train
    if not t.eval_tasks:
        return
    every = t.checkpoint_every
    if t.task_interval is not None and (not every or t.task_interval % every):
        raise InputError(f"train.task_interval={t.task_interval} is not a multiple of the "
                         f"checkpoint interval ({every or 'only the final checkpoint'}); tasks "
                         "are scored at checkpoints: give a multiple, or null (every checkpoint)")


MIXED_FORMATS = ("text", "ids", "parquet", "jsonl", "sql")  # pre-training text: what mixes


def _check_sources(settings: Settings) -> None:
    """A mixture (``data.sources``) instead of ``data.path``: named once each, of pre-training
    text, trained for ``train.max_steps`` (each source has its own epochs), with one tokenizer
    for all; each source's settings pass the checks a run on it alone would."""
    d = settings.data
    if not d.sources:
        return
    if d.path is not None or d.query is not None:
        raise InputError("data.sources and data.path (or data.query) are both given: a "
                         "mixture's sources name their own; drop data.path")
    names = [s.name for s in d.sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError(f"data.sources: the name {twice[0]} is given to "
                         f"{names.count(twice[0])} sources; give each source its own name")
    if settings.train.epochs:
        raise InputError(f"train.epochs={settings.train.epochs}: a mixture counts epochs per "
                         "source; give train.max_steps instead")
    if settings.cluster.keep_executors:  # the sources are handed over from their own entries
        raise InputError("cluster.keep_executors=true: a mixture runs its sources' ETLs on one "
                         "Spark, stopped once the last is prepared; set "
                         "cluster.keep_executors=false")
    for source in d.sources:
        fmt = source.format or d.format
        if fmt not in MIXED_FORMATS:
            raise InputError(f"data.sources: {source.name} has data.format={fmt}; a mixture "
                             f"blends pre-training text ({', '.join(MIXED_FORMATS)})")
        validate(source_settings(settings, source))


def _check_batch(t: TrainSettings) -> None:
    """The global batch splits evenly over the workers and accumulation steps, for every number of
    workers an elastic group (``min_workers``) may have."""
    if t.min_workers is not None and t.min_workers > t.num_workers:
        raise InputError(f"train.min_workers={t.min_workers} is above "
                         f"train.num_workers={t.num_workers}; it is the fewest workers of an "
                         "elastic group, num_workers the most")
    for world in range(t.min_workers or t.num_workers, t.num_workers + 1):
        if t.batch_size % (world * t.grad_accum):
            if world == t.num_workers:
                workers = f"train.num_workers={world}"
            else:
                workers = f"{world} workers (train.min_workers={t.min_workers})"
            raise InputError(f"train.batch_size={t.batch_size} is not divisible by {workers} × "
                             f"train.grad_accum={t.grad_accum}; it is the global batch, split "
                             "evenly over the workers and accumulation steps: set "
                             f"train.batch_size to a multiple of {world * t.grad_accum} "
                             f"(e.g. {_multiples_near(t.batch_size, world * t.grad_accum)})")


def _multiples_near(value: int, step: int) -> str:
    """The multiples of ``step`` on either side of ``value`` (the first one only, when ``value`` is
    below it), for an error line's suggestion."""
    below = value // step * step
    return " or ".join(str(n) for n in (below, below + step) if n > 0)


def cpus_needed(c: ClusterSettings, t: TrainSettings, kept: bool | None = None
                ) -> tuple[float, str]:
    """Ray CPUs the job needs at its peak, and the formula that gives them: the Spark executors and
    the DDP workers (an elastic group's fewest), at once when Spark is ``kept`` through training
    (default: ``keep_executors``), else one after the other."""
    workers = t.min_workers or t.num_workers
    workers_key = "train.min_workers" if t.min_workers else "train.num_workers"
    spark, train = c.executors * c.executor_ray_cpus, workers * t.cpus_per_worker
    kept = c.keep_executors if kept is None else kept
    need = spark + train if kept else max(spark, train)
    formula = (f"cluster.executors={c.executors} × "
               f"cluster.executor_ray_cpus={c.executor_ray_cpus:g} "
               f"{'+' if kept else 'and'} {workers_key}={workers} × "
               f"train.cpus_per_worker={t.cpus_per_worker:g}")
    return need, formula
