"""``python -m raydp_llm.generate model_dir=DIR data.path=PROMPTS out=DIR``: the model's answer to
every row of a table of prompts, on the cluster, the table never whole in one process.

The table's files are indexed by Ray tasks and cut into parts of ``rows_per_part`` rows of one
file each, in the table's order (data/prompts/parts.py); a query's rows are first written by Spark's
executors as Parquet under ``out/_prompts/``. Ray Data hands the parts that ``out`` does not hold
yet to ``Answerer`` actors, each holding the model once; an actor reads its part alone, answers its
prompts one by one with the sampling ``generate`` uses for one prompt (a row's seed is ``seed`` +
its row number, so the answers do not depend on the parts or the actors), and writes the part as
one Parquet file under a temporary name, renamed when whole. The index stays in ``out``
(``prompts.json``): a rerun of the same command answers the parts not written yet of the same
rows, so every row is written once.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raydp_llm.core import storage
from raydp_llm.core.config import GenerateSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.data.chat.template import ChatTemplate, model_template
from raydp_llm.data.inputs.files import resolve_corpus
from raydp_llm.data.prompts.parts import (
    INDEX_FILE,
    STAGED_DIR,
    Part,
    PromptFile,
    first_columns,
    index_file,
    load_index,
    parts_of,
    read_part,
    save_index,
    stage_query,
)

JOB_FILE = "answers.json"  # in out: the job whose parts it holds
PART_FIELDS = [f.name for f in fields(Part)]  # a part as Ray Data hands it over: a row


def prompt_files(s: GenerateSettings) -> list[tuple[str, int]]:
    """The files of ``data.path`` (a corpus's: a file, a directory's, a glob's, local or on S3,
    sorted by name) with their sizes; the first one's prompt (or messages) column checked, before
    any engine starts."""
    given, s3 = s.data.path, S3Options.of(s.s3)
    suffix = (".parquet",) if s.data.format == "parquet" else (".jsonl", ".json")
    corpus = resolve_corpus(given, s3=s3)
    files = [(f, corpus.sizes.get(f)) for f in corpus.files if f.endswith(suffix)]
    if not files:
        raise InputError(f"data.path={given}: no {' or '.join(suffix)} files there; give the "
                         f"prompts as data.format={s.data.format} files")
    check_columns(s, files[0][0], first_columns(files[0][0], s.data.format, s3))
    return files


def check_columns(s: GenerateSettings, uri: str, columns: list[str] | None) -> None:
    """``uri`` holds the prompt (or messages) column: one line when not."""
    if columns is None:
        raise InputError(f"data.path={s.data.path}: {uri} is not JSON Lines (its first row is "
                         "not a JSON object); give one object per line, or data.format=parquet")
    setting, column = prompt_column(s)
    if column not in columns:
        shown = s.data.path or uri
        raise InputError(f"data.{setting}={column}: {shown} has no such column; "
                         f"its columns: {', '.join(columns)}")


def prompt_column(s: GenerateSettings) -> tuple[str, str]:
    """The setting naming the column the prompts are in, and that column."""
    if s.data.messages_column:
        return "messages_column", s.data.messages_column
    return "text_column", s.data.text_column


def chat_template(s: GenerateSettings) -> ChatTemplate | None:
    """The model's chat template when the prompts are turns (``chat=true``, or
    ``data.messages_column``); one line when the model has none."""
    if not (s.chat or s.data.messages_column):
        return None
    chat = model_template(s.model_dir, S3Options.of(s.s3))
    if chat is None:
        raise InputError(f"model_dir={s.model_dir}: no chat template (chat_template.jinja or "
                         "tokenizer_config.json's chat_template) to render the prompts with; "
                         "give a chat model, or drop chat=true and data.messages_column")
    return chat


def prompt_text(row: dict, s: GenerateSettings, chat: ChatTemplate | None) -> str:
    """A row's prompt as the model reads it: its text; with a chat template, that text as a user
    turn (or the row's conversation, ``data.messages_column``) rendered with the generation
    prompt."""
    if chat is None:
        return str(row[s.data.text_column])
    messages = row[s.data.messages_column] if s.data.messages_column else [
        {"role": "user", "content": str(row[s.data.text_column])}]
    return chat.render(messages, add_generation_prompt=True)


def staged_query(s: GenerateSettings, out: str) -> list[str]:
    """The rows of ``data.query`` (Spark SQL over the catalog, or files), their prompt (or
    messages) column checked, written by Spark's executors as Parquet files under
    ``out/_prompts/``, never collected; Spark stops before the actors start. Spark's logs go to a
    temporary directory, gone with Spark."""
    import tempfile

    from raydp_llm.core.config import ClusterSettings
    from raydp_llm.data.inputs.query import query_rows
    from raydp_llm.engines.spark import spark_session

    with tempfile.TemporaryDirectory(prefix="raydp_llm_prompts_") as logs, \
            spark_session(ClusterSettings(), app_name="generate", log_dir=Path(logs),
                          hive=True) as spark:
        _, column = prompt_column(s)
        rows = query_rows(spark, s.data, [column])
        return stage_query(rows, storage.join(out, STAGED_DIR), S3Options.of(s.s3))


def indexed(s: GenerateSettings, out: str, listed: list[tuple[str, int]] | None
            ) -> list[PromptFile]:
    """The table's files, indexed: the index ``out`` keeps (a rerun's; ``data.path``'s files
    checked unchanged since), else a new one, a Ray task per file (a query's rows staged first),
    kept in ``out``."""
    import ray

    s3, where = S3Options.of(s.s3), storage.join(out, INDEX_FILE)
    kept = load_index(where, s3)
    if kept is not None:
        if listed is not None and [(f.uri, f.size) for f in kept] != listed:
            raise InputError(f"data.path={s.data.path}: its files changed since the job in "
                             f"out={out} began (names or sizes differ); give a new out, or "
                             "the files as they were")
        return kept
    if listed is None:
        listed = [(uri, 0) for uri in staged_query(s, out)]
    task = ray.remote(num_cpus=1)(index_file)
    try:
        files = ray.get([task.remote(uri, size, table_format(s), s.rows_per_part, s3)
                         for uri, size in listed])
    except ray.exceptions.RayTaskError as err:  # a file's rows refused: its own line
        if isinstance(err.cause, InputError):
            raise err.cause from None
        raise
    for f in files:
        check_columns(s, f.uri, f.columns)
    save_index(where, files, s3)
    return files


def table_format(s: GenerateSettings) -> str:
    """The format of the files the parts are read from: a query's rows are staged as Parquet."""
    return "parquet" if s.data.query else s.data.format


def job_identity(s: GenerateSettings) -> dict:
    """What makes ``out``'s parts this job's: the model, the prompts, the sampling, the parts
    (the rows themselves: the index kept beside them, ``indexed``)."""
    return {"model_dir": s.model_dir, "data": {"path": s.data.path, "query": s.data.query,
                                               "format": s.data.format,
                                               "text_column": s.data.text_column,
                                               "messages_column": s.data.messages_column},
            "chat": s.chat, "rows_per_part": s.rows_per_part,
            "max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_k": s.top_k,
            "seed": s.seed}


def claim_out(out: str, identity: dict, s3: S3Options) -> None:
    """``out`` (a directory or an ``s3://`` prefix) is new, or holds this job's parts (a rerun
    continues it); another job's output is one line, nothing touched."""
    record = storage.join(out, JOB_FILE)
    if storage.exists(record, s3):
        found = storage.read_json(record, s3)
        if found != identity:
            differs = sorted(k for k in identity if found.get(k) != identity[k])
            raise InputError(f"out={out} holds another job's answers ({', '.join(differs)} "
                             "differ); give a new out, or the same settings to continue it")
        return
    if holds_files(out, s3):
        raise InputError(f"out={out} is not empty and holds no answers job ({JOB_FILE}); give a "
                         "new or empty directory")
    storage.write_text(record, json.dumps(identity, indent=1), s3)


def holds_files(out: str, s3: S3Options) -> bool:
    if storage.is_s3(out):
        return bool(storage.list_objects(out, s3))
    return Path(out).exists() and any(Path(out).iterdir())


def part_file(out: str, part: int) -> str:
    return storage.join(out, f"part-{part:05d}.parquet")


def write_part_file(rows: pa.Table, out: str, part: int, s3: S3Options) -> None:
    """A part whole or absent, so that a killed run leaves no part: locally under a temporary
    name, then renamed; on S3 a PUT is whole already."""
    fs, path = storage.resolve(part_file(out, part), s3)
    if storage.is_s3(out):
        pq.write_table(rows, path, filesystem=fs)
        return
    tmp = Path(out) / f".part-{part:05d}.tmp"
    pq.write_table(rows, tmp)
    tmp.replace(path)


def plain(value):
    """A value of a Ray Data batch as Python has it: numbers come as NumPy's, strings as str."""
    return value.item() if isinstance(value, np.generic) else value


class Answerer:
    """Ray Data's actor: the model loaded once; a batch of parts in (``Part``'s fields), each
    part's rows read, answered and written, their row counts out."""

    def __init__(self, s: GenerateSettings, out: str, chat: ChatTemplate | None,
                 schemas: dict[str, str]):
        import torch

        from raydp_llm.checkpoint.model_dir import load_model_dir

        torch.set_num_threads(1)  # an actor per CPU
        self.s, self.out, self.chat, self.schemas = s, out, chat, schemas
        self.s3 = S3Options.of(s.s3)
        self.end = chat.end_of_turn() if chat else None  # where a reply stops
        self.model, self.tokenizer = load_model_dir(s.model_dir, s3=self.s3)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        parts = [Part(**{k: plain(batch[k][i]) for k in PART_FIELDS})
                 for i in range(len(batch["number"]))]
        rows = [self.write_part(part) for part in parts]
        return {"number": batch["number"], "rows": np.array(rows, dtype=np.int64)}

    def write_part(self, part: Part) -> int:
        rows = read_part(part, table_format(self.s), self.schemas.get(part.uri, ""), self.s3)
        answers = [answer(self.model, self.tokenizer, prompt_text(row, self.s, self.chat),
                          self.s, part.row0 + i, self.end)
                   for i, row in enumerate(rows.to_pylist())]
        for name in ("completion", "completion_tokens", "mean_logprob"):
            rows = rows.append_column(name, pa.array([a[name] for a in answers]))
        write_part_file(rows, self.out, part.number, self.s3)
        return rows.num_rows


def answer(model, tokenizer, prompt: str, s: GenerateSettings, row: int,
           end: str | None = None) -> dict:
    """The model's continuation of ``prompt`` as ``generate`` samples it for one prompt (the
    seed: ``s.seed`` + ``row``), stopped where it writes ``end`` (a chat turn's end, cut off the
    text): its text, its tokens and their mean log-probability."""
    import torch

    from raydp_llm.training.driver.generation import prompt_ids, turn_stop

    idx = prompt_ids(model, tokenizer, prompt)
    start = idx.size(1)
    gen = torch.Generator(device=idx.device).manual_seed(s.seed + row)
    logprobs: list = []
    stop = None if end is None else turn_stop(tokenizer, start, end)
    with torch.no_grad():
        out = model.generate(idx, s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                             generator=gen, logprobs=logprobs, stop=stop)
    new = out[0, start:].tolist()
    text = tokenizer.decode(new)
    mean = torch.stack(logprobs).mean().item() if logprobs else math.nan
    return {"completion": text.split(end, 1)[0] if end else text, "completion_tokens": len(new),
            "mean_logprob": mean}


def answer_table(s: GenerateSettings) -> dict:
    """Every prompt of ``data.path`` (or ``data.query``) answered into ``out`` (the parts it
    lacks); what was done."""
    import ray
    import ray.data

    from raydp_llm.core.config import ClusterSettings
    from raydp_llm.engines.ray_cluster import ray_session

    # files: bad input is one line before Ray starts; a query's rows come from Spark on Ray
    s3 = S3Options.of(s.s3)
    chat, out = chat_template(s), s.out if storage.is_s3(s.out) else str(Path(s.out).absolute())
    listed = None if s.data.query else prompt_files(s)
    claim_out(out, job_identity(s), s3)
    with ray_session(ClusterSettings(), "generate"):
        files = indexed(s, out, listed)
        parts = parts_of(files, s.rows_per_part)
        todo = [p for p in parts if not storage.exists(part_file(out, p.number), s3)]
        if todo:
            actors = s.actors or max(1, int(ray.cluster_resources().get("CPU", 1)))
            schemas = {f.uri: f.schema for f in files if f.schema}
            done = ray.data.from_items([asdict(p) for p in todo]).map_batches(
                Answerer, fn_constructor_args=(s, out, chat, schemas), batch_size=1,
                concurrency=min(actors, len(todo)), num_cpus=1)
            done.materialize()
    appended = append_answers(s, out, parts, s3) if s.output.table else None
    return {"rows": sum(f.rows for f in files), "parts": len(parts), "answered": len(todo),
            "out": out, "appended": appended}


GROUP_PARTS = 64  # parts one commit of output.table appends


def job_id(s: GenerateSettings, out: str) -> str:
    """The answers job's id: its identity (``job_identity``) and its ``out``, hashed."""
    identity = json.dumps(job_identity(s) | {"out": out}, sort_keys=True)
    return "answers-" + hashlib.sha256(identity.encode()).hexdigest()[:16]


def append_answers(s: GenerateSettings, out: str, parts: list[Part], s3: S3Options) -> int:
    """Every part of ``out`` appended to ``output.table`` once (``table_out.append_once``), a
    commit per ``GROUP_PARTS`` parts, each row with ``answers_job``, ``model_dir`` and
    ``model_table`` (the snapshot its model learned from, JSON; null when not a table's)."""
    from raydp_llm.data.inputs.table_out import append_once
    from raydp_llm.data.inputs.tables import model_snapshot

    job, snapshot = job_id(s, out), model_snapshot(s.model_dir, s3)
    source = None if snapshot is None else json.dumps(snapshot, sort_keys=True)

    def group(numbers: list[int]):
        def read() -> pa.Table:
            rows = pa.concat_tables([read_part_file(out, n, s3) for n in numbers],
                                    promote_options="default")
            count = rows.num_rows
            return (rows.append_column("answers_job", pa.array([job] * count, pa.string()))
                    .append_column("model_dir", pa.array([s.model_dir] * count, pa.string()))
                    .append_column("model_table", pa.array([source] * count, pa.string())))
        return read

    numbers = [p.number for p in parts]
    groups = [group(numbers[i:i + GROUP_PARTS]) for i in range(0, len(numbers), GROUP_PARTS)]
    return append_once(s.output.table, dict(s.output.catalog), job, groups, s3)


def read_part_file(out: str, part: int, s3: S3Options) -> pa.Table:
    fs, path = storage.resolve(part_file(out, part), s3)
    return pq.read_table(path, filesystem=fs)
