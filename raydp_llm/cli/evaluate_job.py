"""The evaluate job (``python -m raydp_llm.evaluate``, whose door is ``cli/evaluate.py``): the
model of ``model_dir`` scored on a corpus, on preference pairs (DPO's loss against a reference), on
a mixture's sources, or on lm-evaluation-harness tasks; ``evaluation.json`` and the console."""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa
import ray
import torch
import yaml

from raydp_llm.checkpoint.layout import PREFERENCE_RECORD, ModelDirError, check_model_files
from raydp_llm.checkpoint.model_dir import load_model_dir
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.cli.scores import score_documents
from raydp_llm.core import storage
from raydp_llm.core.config import DpoSettings, EvaluateSettings, source_settings
from raydp_llm.core.errors import InputError, first_line
from raydp_llm.core.storage import S3Options
from raydp_llm.core.timing import Stopwatch, timed
from raydp_llm.core.tokenizer import TOKENIZER_FILE, load_tokenizer
from raydp_llm.data import cache
from raydp_llm.data.batches import WindowBatch
from raydp_llm.data.prepare import dataset_store, write_json
from raydp_llm.data.stream import Windows, iter_windows
from raydp_llm.models.base import LanguageModel
from raydp_llm.models.files import is_hf_dir
from raydp_llm.training.driver import tracking
from raydp_llm.training.driver.session import job_session
from raydp_llm.training.objectives.dpo import logps_of
from raydp_llm.training.objectives.dpo_loss import dpo_loss, means
from raydp_llm.training.objectives.grpo import prompt_rows
from raydp_llm.training.objectives.lm import bits_per_char
from raydp_llm.training.objectives.rollout import evaluate, scoring_for, weights_of
from raydp_llm.training.spec import scoring_samplings
from raydp_llm.training.tasks import HarnessSettings, run_tasks, show_tasks

log = logging.getLogger(__name__)

OBJECTIVE_OF = {"preference": "dpo", "prompts": "grpo"}  # what a format is scored by


def model_and_settings(
    settings: EvaluateSettings, out_dir: Path, window: int | None = None
) -> tuple[LanguageModel, EvaluateSettings]:
    """The model of ``model_dir`` (an s3:// one is fetched to ``out_dir/model``), and the settings
    the ETL runs with for it: the model's tokenizer and block size (``window`` when given: the
    command line's ``model.block_size``), and, for an id model, its vocabulary size."""
    model_dir = local_model_dir(settings, out_dir)
    hf_dir = is_hf_dir(model_dir)  # a Hugging Face directory, trained here or elsewhere
    model, tokenizer = load_model_dir(model_dir)
    if window is not None and window > model.longest_window():
        raise InputError(f"model.block_size={window}: {settings.model_dir} reads at most "
                         f"{model.longest_window()} tokens at once; give model.block_size="
                         f"{model.longest_window()} or less, or leave it out (the trained "
                         f"{model.config.block_size})")
    ids_model = tokenizer.kind == "ids"
    if ids_model != (settings.data.format == "ids"):
        fit = "ids" if ids_model else "text (or parquet)"
        raise InputError(f"data.format={settings.data.format} does not fit the model's "
                         f"{tokenizer.kind} tokenizer: set data.format={fit}")
    data = settings.data
    if ids_model:  # ids beyond the model's vocabulary are then bad input, reported by the ETL
        data = replace(data, vocab_size=tokenizer.vocab_size)
    return model, replace(
        settings,
        data=data,
        # preference pairs are scored with DPO's loss, prompts with the rewards (the checks hold
        # each format to its objective)
        train=replace(settings.train, objective=OBJECTIVE_OF.get(data.format, "lm")),
        tokenizer=replace(settings.tokenizer,
                          path=str(model_dir if hf_dir else model_dir / TOKENIZER_FILE)),
        model=replace(settings.model, block_size=window or model.config.block_size),
    )


def query_task(settings: EvaluateSettings, out_dir: Path) -> str:
    """The one task YAML given, its rows ``data.query``'s: Spark (on Ray, started for it) runs the
    query; its rows go to ``out_dir/query_task/rows.jsonl`` (a benchmark's few thousand rows, on the
    driver), beside a YAML that includes the user's and reads them as its test split (no other
    split: few-shot examples come from them too)."""
    from raydp_llm.data.inputs.query import query_rows
    from raydp_llm.engines.spark import spark_session
    from raydp_llm.training.tasks import yaml_task

    given = settings.tasks
    if len(given) != 1 or not given[0].endswith((".yaml", ".yml")):
        raise InputError(f"data.query gives one task's rows, and tasks={list(given)}; give one "
                         "task YAML (tasks=[TASK.yaml]): the query's rows become its test split")
    name, folder = yaml_task(Path(given[0])), out_dir / "query_task"
    folder.mkdir(parents=True, exist_ok=True)
    with job_session(settings, None), spark_session(settings.cluster, "evaluate", out_dir,
                                                    hive=True) as spark:
        table = pa.Table.from_batches(query_rows(spark, settings.data)._collect_as_arrow())
    rows = folder / "rows.jsonl"
    rows.write_text("".join(json.dumps(r, default=str) + "\n" for r in table.to_pylist()))
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({
        "include": str(Path(given[0]).resolve()), "task": name, "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(rows)}}, "test_split": "test",
        "training_split": None, "validation_split": None, "fewshot_split": None}))
    return str(folder / f"{name}.yaml")


def local_model_dir(settings: EvaluateSettings, out_dir: Path) -> Path:
    """``model_dir``, an s3:// one fetched into the run directory (the ETL and the harness read
    it there) and checked to hold a model, as the door checks a local one."""
    if not storage.is_s3(settings.model_dir):
        return Path(settings.model_dir)
    try:
        storage.fetch(settings.model_dir, out_dir / "model", S3Options.of(settings.s3))
    except OSError as err:
        raise storage.unreachable("model_dir", settings.model_dir, err) from None
    check_model_files(out_dir / "model", settings.model_dir)
    return out_dir / "model"


@torch.no_grad()
def score(model: LanguageModel, batches: Iterable[Windows], collate: WindowBatch) -> dict:
    """Summed cross-entropy (nats) and correct top-1 predictions of the next token, over windows and
    tokens."""
    model.eval()
    totals = {"windows": 0, "tokens": 0, "nats": 0.0, "correct": 0}
    for windows in batches:
        batch = collate(windows.tokens, windows.lengths)
        # chat data: the targets data.train_on keeps
        _, scores = model(batch.inputs, batch.targets, positions=batch.positions)
        totals["nats"] += float(scores.nats.sum())
        totals["correct"] += int(scores.hits.sum())
        totals["windows"] += len(batch.targets)
        totals["tokens"] += int(scores.counted.sum())
    return totals


def metrics(totals: dict, chars_per_token: float | None) -> dict:
    """Per-token loss (nats), perplexity, bits per character (None for id corpora), top-1
    accuracy."""
    loss = totals["nats"] / totals["tokens"]
    return {"loss": loss, "perplexity": math.exp(loss),
            "bits_per_char": bits_per_char(loss, chars_per_token),
            "accuracy": totals["correct"] / totals["tokens"], "windows": totals["windows"],
            "tokens": totals["tokens"]}


def run(settings: EvaluateSettings, out_dir: Path, window: int | None = None) -> dict:
    """``evaluated`` logged to MLflow with ``tracking=mlflow`` (the door's ``run``)."""
    tracker = tracking.tracker(settings.tracking)  # its store reached before any engine starts
    evaluation = evaluated(settings, out_dir, window)
    tracker.log_evaluation(settings, evaluation, out_dir)
    return evaluation


def evaluated(settings: EvaluateSettings, out_dir: Path, window: int | None = None) -> dict:
    """Evaluate ``settings.model_dir`` on ``settings.data`` into ``out_dir`` (windows of
    ``window`` tokens, default the model's block size), or on ``settings.tasks``; returns what
    ``evaluation.json`` holds."""
    total = Stopwatch()
    if settings.tasks:  # benchmark tasks instead of a corpus
        return evaluate_tasks(settings, out_dir, total)
    model, settings = model_and_settings(settings, out_dir, window)
    if settings.data.sources:
        return run_sources(settings, model, out_dir, total)
    if settings.data.format == "prompts":
        return evaluate_prompts(settings, model, out_dir, total)
    judge = PairJudge.of(settings, model) if settings.data.pairs else None
    corpus = check_inputs(settings)  # bad input fails here, before Ray starts
    with job_session(settings, dataset_store(settings.data, out_dir)) as session:
        data, timings = session.prepare(corpus, out_dir, every_token=True), session.timings
        scores = None
        if settings.per_document:  # on the cluster, Spark gone: its CPUs are free
            with timed(timings, "per_document_s"):
                tokenizer_at = Path(settings.tokenizer.path)  # the model's directory, or in it
                scores = score_documents(
                    str(tokenizer_at if tokenizer_at.is_dir() else tokenizer_at.parent),
                    data.entry, out_dir,
                    settings.eval_batch_size, max(1, int(ray.cluster_resources().get("CPU", 1))))
    m = data.manifest
    with timed(timings, "eval_s"):
        torch.set_num_threads(os.cpu_count())
        batches = corpus_windows(settings, data)
        collate = WindowBatch(torch.device("cpu"), chat=m.chat is not None,
                              pairs=settings.data.pairs)
        if judge is not None:
            result = judge.score(model, batches, collate)
        else:
            result = metrics(score(model, batches, collate), m.chars_per_token)
    timings["total_s"] = total.seconds()
    evaluation = {
        "model_dir": settings.model_dir,
        **result,
        "dataset": str(data.entry),
        "document_scores": str(scores) if scores else None,
        **{k: round(v, 2) for k, v in timings.items()},
        "etl": data.manifest_json() | {"cache_hit": data.cache_hit},
    }
    record(settings, out_dir, evaluation)
    (show_pairs if judge else show)(evaluation, result, timings, data.cache_hit, out_dir)
    return evaluation


def evaluate_prompts(settings: EvaluateSettings, model: LanguageModel, out_dir: Path,
                     total: Stopwatch) -> dict:
    """One greedy answer (``grpo.max_new_tokens``) to every prompt of ``data``, both splits,
    scored by ``grpo.rewards``: the mean reward over the prompts and each function's."""
    corpus = check_inputs(settings)  # the rewards found, before Ray starts
    with job_session(settings, None) as session:
        with session.prompts(corpus, out_dir, training=False) as data:
            prompts = sorted((p for name in ("train", "val")
                              for p in prompt_rows(data.sources[name].table())),
                             key=lambda p: p.index)
        timings = session.timings
    with timed(timings, "eval_s"):
        torch.set_num_threads(os.cpu_count())
        found = answered(settings, model, prompts, data.template)
    timings["total_s"] = total.seconds()
    evaluation = {"model_dir": settings.model_dir, "prompts": len(prompts),
                  "reward": found.reward,
                  **{f"reward_{name}": value for name, value in found.per_function.items()},
                  **{k: round(v, 2) for k, v in timings.items()},
                  "etl": data.manifest_json() | {"cache_hit": False}}
    record(settings, out_dir, evaluation)
    print(f"{settings.model_dir} on {corpus.name}: {len(prompts):,} prompts, a greedy answer "
          f"each of at most {settings.grpo.max_new_tokens} tokens")
    for name in ("reward", *(f"reward_{k}" for k in found.per_function)):
        print(f"{name} {evaluation[name]:.4f}")
    print(f"done in {timings['total_s']:.0f}s (ETL {timings['etl_s']:.0f}s, evaluation "
          f"{timings['eval_s']:.0f}s); evaluation.json in {out_dir}")
    return evaluation


def answered(settings: EvaluateSettings, model: LanguageModel, prompts: list, template):
    """``rollout.evaluate`` of ``prompts`` with the rewards in their own process."""
    tokenizer, grpo = load_tokenizer(Path(settings.tokenizer.path)), settings.grpo
    end_text = template.end_of_turn() if template else None
    scoring = scoring_for(grpo, tokenizer, end_text, model)
    try:
        return evaluate(model.eval(), prompts, grpo, scoring, weights_of(grpo))
    finally:
        scoring.calls.close()


def evaluate_tasks(settings: EvaluateSettings, out_dir: Path, total: Stopwatch) -> dict:
    """lm-evaluation-harness's ``settings.tasks`` on the model (training/tasks.py), offline, in this
    process: no Ray, no Spark, unless ``data.query`` gives the task's rows (``query_task``)."""
    model_dir, timings = local_model_dir(settings, out_dir), {}
    tasks = [query_task(settings, out_dir)] if settings.data.query else settings.tasks
    with timed(timings, "eval_s"):
        found = run_tasks(tasks, model_dir, out_dir, HarnessSettings(
            settings.num_fewshot, settings.limit, settings.eval_batch_size, settings.seed),
            S3Options.of(settings.s3))
    timings["total_s"] = total.seconds()
    evaluation = {"model_dir": settings.model_dir, "tasks": found["tasks"],
                  **{k: round(v, 2) for k, v in timings.items()}, "harness": found["harness"]}
    out_dir.mkdir(parents=True, exist_ok=True)  # a model directory the harness reads as it is
    record(settings, out_dir, evaluation)
    show_tasks(settings.model_dir, found["tasks"], out_dir)
    return evaluation


def run_sources(settings: EvaluateSettings, model: LanguageModel, out_dir: Path,
                total: Stopwatch) -> dict:
    """A mixture (``data.sources``): each source scored as a corpus of its own (its own ETL or
    cache entry), and the loss weighted by the sources' weights, as training's ``val_loss``
    is."""
    if settings.per_document:
        raise InputError("per_document=true scores the documents of one corpus; give data.path "
                         "(a source's) instead of data.sources")
    corpora = check_inputs(settings)  # a corpus per source; bad input fails before Ray starts
    weight_sum = sum(s.weight for s in settings.data.sources)
    prepared, sources = {}, {}
    with job_session(settings, dataset_store(settings.data, out_dir)) as session, \
            session.one_spark(out_dir):
        for source in settings.data.sources:
            own = source_settings(settings, source)
            logs = out_dir / "sources" / source.name
            logs.mkdir(parents=True, exist_ok=True)
            prepared[source.name] = (own, session.prepare(corpora[source.name], logs,
                                                          every_token=True, settings=own))
        timings = session.timings
    torch.set_num_threads(os.cpu_count())
    with timed(timings, "eval_s"):
        for source in settings.data.sources:
            own, data = prepared[source.name]
            collate = WindowBatch(torch.device("cpu"))
            found = metrics(score(model, corpus_windows(own, data), collate),
                            data.manifest.chars_per_token)
            sources[source.name] = found | {"weight": source.weight / weight_sum,
                                            "dataset": str(data.entry),
                                            "cache_hit": data.cache_hit}
    timings["total_s"] = total.seconds()
    evaluation = {"model_dir": settings.model_dir,
                  "loss": sum(s["weight"] * s["loss"] for s in sources.values()),
                  "sources": sources, **{k: round(v, 2) for k, v in timings.items()}}
    record(settings, out_dir, evaluation)
    print(f"{settings.model_dir} on {len(sources)} sources, loss weighted "
          f"{evaluation['loss']:.4f}")
    for name, found in sources.items():
        print(f"  {name} (weight {found['weight']:.3g}): loss {found['loss']:.4f}, perplexity "
              f"{found['perplexity']:.3f}, {found['tokens']:,} tokens predicted")
    return evaluation


def corpus_windows(settings: EvaluateSettings, data) -> Iterator[Windows]:
    """Every window of the corpus, both splits, in stream order, in batches of
    ``eval_batch_size``: every token but a split's first is predicted once
    (``spec.scoring_samplings``)."""
    cut = scoring_samplings(settings)
    sources = cache.parquet_sources(data.entry, data.index, S3Options.of(settings.s3))
    for split in ("train", "val"):
        yield from iter_windows(sources[split], data.index[split], cut[split],
                                data.manifest.token_dtype, settings.eval_batch_size)


@dataclass
class PairJudge:
    """``data.format=preference``: the DPO loss and rewards of the model against its reference
    (``ref_model_dir``: given, else the one its directory records), with the DPO settings it was
    tuned with but those the command line gives (both from ``layout.PreferenceRecord`` at the door:
    ``inputs.typed_settings``)."""

    reference: LanguageModel
    reference_dir: str
    dpo: DpoSettings

    @classmethod
    def of(cls, settings: EvaluateSettings, model: LanguageModel) -> PairJudge:
        """The reference loaded and checked against ``model``, before any engine starts."""
        s3, ref_dir = S3Options.of(settings.s3), settings.ref_model_dir
        if ref_dir is None:
            raise InputError(f"model_dir={settings.model_dir} records no DPO reference (no "
                             f"{PREFERENCE_RECORD}): give ref_model_dir=DIR, the model it was "
                             "tuned from")
        try:
            ref, _ = load_model_dir(ref_dir, s3=s3, key="ref_model_dir")
        except (OSError, ModelDirError) as err:
            raise InputError(f"ref_model_dir={ref_dir}: {first_line(err, 200)}; give the model "
                             "model_dir was tuned from") from None
        if ref.config.vocab_size != model.config.vocab_size:
            raise InputError(f"ref_model_dir={ref_dir}: its vocabulary ({ref.config.vocab_size} "
                             f"tokens) is not model_dir's ({model.config.vocab_size}); give the "
                             "model model_dir was tuned from")
        return cls(ref.eval(), ref_dir, settings.dpo)

    @torch.no_grad()
    def score(self, model: LanguageModel, batches: Iterable[Windows],
              collate: WindowBatch) -> dict:
        """The DPO figures per pair (``dpo.means``) over every pair of ``batches``."""
        model.eval()
        totals: dict[str, float] = {}
        for windows in batches:
            batch = collate(windows.tokens)  # a pair is two whole records
            policy, ref = logps_of(model, batch), logps_of(self.reference, batch)
            out = dpo_loss(policy, ref, self.dpo.beta, self.dpo.loss, self.dpo.label_smoothing)
            for k, v in out.sums().items():
                totals[k] = totals.get(k, 0.0) + v
        return {**means(totals), "pairs": int(totals.get("pairs", 0)),
                "reference": self.reference_dir,
                "dpo": {"beta": self.dpo.beta, "loss": self.dpo.loss,
                        "label_smoothing": self.dpo.label_smoothing}}


def show_pairs(evaluation: dict, result: dict, timings: dict, cache_hit: bool,
               out_dir: Path) -> None:
    """A preference evaluation on the console: one ``name value`` line per figure."""
    m = evaluation["etl"]
    print(f"{evaluation['model_dir']} on {m['corpus']}: {result['pairs']:,} pairs against "
          f"{result['reference']} (dpo.loss={result['dpo']['loss']}, "
          f"dpo.beta={result['dpo']['beta']})")
    for name in ("loss", "reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward",
                 "chosen_logp", "rejected_logp"):
        print(f"{name} {result[name]:.4f}")
    print(f"done in {timings['total_s']:.0f}s (ETL {timings['etl_s']:.0f}s"
          f"{', cache hit' if cache_hit else ''}, evaluation {timings['eval_s']:.0f}s); "
          f"evaluation.json in {out_dir}")


def show(evaluation: dict, result: dict, timings: dict, cache_hit: bool, out_dir: Path) -> None:
    """The evaluation as a table on the console."""
    m, bpc = evaluation["etl"], result["bits_per_char"]
    scores = evaluation["document_scores"]
    print(f"{evaluation['model_dir']} on {m['corpus']}: {result['windows']:,} windows of "
          f"{m['block_size'] + 1} tokens, stride {m['stride']}, {result['tokens']:,} tokens "
          f"predicted\n  loss (nats/token)  {result['loss']:.4f}\n  perplexity         "
          f"{result['perplexity']:.3f}\n  bits per char      "
          f"{'n/a (token ids)' if bpc is None else f'{bpc:.4f}'}\n  top-1 accuracy     "
          f"{result['accuracy']:.4f}\n  done in {timings['total_s']:.0f}s (ETL "
          f"{timings['etl_s']:.0f}s{', cache hit' if cache_hit else ''}, evaluation "
          f"{timings['eval_s']:.0f}s); evaluation.json in {out_dir}")
    if scores:
        print(f"  every document scored on the cluster in {timings['per_document_s']:.0f}s: "
              f"{scores} (data.filters.score_path)")


def record(settings: EvaluateSettings, out_dir: Path, evaluation: dict) -> None:
    """``evaluation.json``, and with ``output.table`` its figures appended to it: a row per
    figure (``score_rows``), in one commit marked with this evaluation's directory (once)."""
    write_json(out_dir / "evaluation.json", evaluation)
    if not settings.output.table:
        return
    from raydp_llm.data.inputs.table_out import append_once
    from raydp_llm.data.inputs.tables import model_snapshot

    s3, output = S3Options.of(settings.s3), settings.output
    snapshot = model_snapshot(settings.model_dir, s3)
    rows = score_rows(evaluation, str(out_dir),
                      None if snapshot is None else json.dumps(snapshot, sort_keys=True))
    append_once(output.table, dict(output.catalog), f"evaluation-{out_dir}", [lambda: rows], s3)
    print(f"appended to {output.table}: {rows.num_rows} figures")


def figures(evaluation: dict, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number of ``evaluation``, its key dotted (``sources.news.val_loss``); the ETL's
    manifest and the timings left out."""
    for key, value in evaluation.items():
        if key == "etl" or key.endswith("_s"):
            continue
        if isinstance(value, dict):
            yield from figures(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", float(value)


def score_rows(evaluation: dict, out_dir: str, model_table: str | None) -> pa.Table:
    """The scores as a table of one row per figure: when, which evaluation and model (and the
    table snapshots the model learned from and was evaluated on, JSON), the figure, its value."""
    import datetime as dt

    found = list(figures(evaluation))
    data_table = (evaluation.get("etl") or {}).get("table")
    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    columns = {
        "evaluated_at": [when] * len(found), "evaluation_dir": [out_dir] * len(found),
        "model_dir": [evaluation.get("model_dir")] * len(found),
        "model_table": [model_table] * len(found),
        "data_table": [json.dumps(data_table, sort_keys=True) if data_table else None]
        * len(found),
        "figure": [name for name, _ in found], "value": [value for _, value in found]}
    return pa.table({k: pa.array(v, pa.float64() if k == "value" else pa.string())
                     for k, v in columns.items()})
