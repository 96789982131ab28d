"""``python -m raydp_llm.generate model_dir=DIR data.path=PROMPTS out=DIR``: the model's answer to
every row of a table of prompts, on the cluster.

The rows are cut into parts of ``rows_per_part``, in the input's order (files sorted by name). Ray
Data hands the parts that ``out`` does not hold yet to ``Answerer`` actors, each holding the model
once; an actor answers its part's prompts one by one with the sampling ``generate`` uses for one
prompt (a row's seed is ``seed`` + its row number, so the answers do not depend on the parts or the
actors), and writes the part as one Parquet file under a temporary name, renamed when whole: a rerun
of the same command skips the parts written and answers the rest, so every row is written once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from raydp_llm.core import storage
from raydp_llm.core.config import GenerateSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.data.chat import ChatTemplate, model_template
from raydp_llm.data.corpus import resolve_corpus

JOB_FILE = "answers.json"  # in out: the job whose parts it holds


def read_prompts(s: GenerateSettings) -> pa.Table:
    """Every row of ``data.path`` (its files found as a corpus's: a file, a directory's, a glob's,
    local or on S3, sorted by name), its prompt (or messages) column checked."""
    given, s3 = s.data.path, S3Options.of(s.s3)
    suffix = (".parquet",) if s.data.format == "parquet" else (".jsonl", ".json")
    files = [f for f in resolve_corpus(given, s3=s3).files if f.endswith(suffix)]
    if not files:
        raise InputError(f"data.path={given}: no {' or '.join(suffix)} files there; give the "
                         f"prompts as data.format={s.data.format} files")
    table = pa.concat_tables([read_file(f, s.data.format, s3) for f in files],
                             promote_options="default")
    setting, column = prompt_column(s)
    if column not in table.column_names:
        raise InputError(f"data.{setting}={column}: {given} has no such column; "
                         f"its columns: {', '.join(table.column_names)}")
    return table


def read_file(uri: str, data_format: str, s3: S3Options) -> pa.Table:
    fs, path = storage.resolve(uri, s3)
    if data_format == "parquet":
        return pq.read_table(path, filesystem=fs)
    with fs.open_input_file(path) as f:
        return pj.read_json(f)


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


def query_prompts(s: GenerateSettings) -> pa.Table:
    """The rows of ``data.query`` (Spark SQL over the catalog, or files), collected on the driver,
    their prompt (or messages) column checked; Spark stops before the actors start. Spark's logs
    go to a temporary directory, gone with Spark: ``out`` holds answers only."""
    import tempfile

    from raydp_llm.core.config import ClusterSettings
    from raydp_llm.data.etl.query import query_rows
    from raydp_llm.engines.spark import spark_session

    with tempfile.TemporaryDirectory(prefix="raydp_llm_prompts_") as logs, \
            spark_session(ClusterSettings(), app_name="generate", log_dir=Path(logs),
                          hive=True) as spark:
        _, column = prompt_column(s)
        rows = query_rows(spark, s.data, [column])
        # PySpark 3.5's Arrow collect (toPandas' own): lists of structs (messages) stay as they are
        return pa.Table.from_batches(rows._collect_as_arrow())


def claimed(table: pa.Table, s: GenerateSettings, out: str) -> pa.Table:
    """``table``, once ``out`` is this job's (``claim_out``)."""
    claim_out(out, job_identity(s, table.num_rows), S3Options.of(s.s3))
    return table


def job_identity(s: GenerateSettings, rows: int) -> dict:
    """What makes ``out``'s parts this job's: the model, the prompts, the sampling, the parts."""
    return {"model_dir": s.model_dir, "data": {"path": s.data.path, "query": s.data.query,
                                               "format": s.data.format,
                                               "text_column": s.data.text_column,
                                               "messages_column": s.data.messages_column},
            "chat": s.chat, "rows": rows, "rows_per_part": s.rows_per_part,
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


class Answerer:
    """Ray Data's actor: the model loaded once; a batch of part numbers in, each part's rows
    answered and written, their row counts out."""

    def __init__(self, s: GenerateSettings, table: pa.Table, out: str, chat: ChatTemplate | None):
        import torch

        from raydp_llm.checkpoint.model_dir import load_model_dir

        torch.set_num_threads(1)  # an actor per CPU
        self.s, self.table, self.out, self.chat = s, table, out, chat
        self.end = chat.end_of_turn() if chat else None  # where a reply stops
        self.model, self.tokenizer = load_model_dir(s.model_dir, s3=S3Options.of(s.s3))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = [self.write_part(int(p)) for p in batch["part"]]
        return {"part": batch["part"], "rows": np.array(rows, dtype=np.int64)}

    def write_part(self, part: int) -> int:
        first = part * self.s.rows_per_part
        rows = self.table.slice(first, self.s.rows_per_part)
        answers = [answer(self.model, self.tokenizer, prompt_text(row, self.s, self.chat), self.s,
                          first + i, self.end)
                   for i, row in enumerate(rows.to_pylist())]
        for name in ("completion", "completion_tokens", "mean_logprob"):
            rows = rows.append_column(name, pa.array([a[name] for a in answers]))
        write_part_file(rows, self.out, part, S3Options.of(self.s.s3))
        return rows.num_rows


def answer(model, tokenizer, prompt: str, s: GenerateSettings, row: int,
           end: str | None = None) -> dict:
    """The model's continuation of ``prompt`` as ``generate`` samples it for one prompt (the
    seed: ``s.seed`` + ``row``), stopped where it writes ``end`` (a chat turn's end, cut off the
    text): its text, its tokens and their mean log-probability."""
    import torch

    from raydp_llm.training.generation import prompt_ids, turn_stop

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
    """Every prompt of ``data.path`` answered into ``out`` (the parts it lacks); what was done."""
    import ray
    import ray.data

    from raydp_llm.core.config import ClusterSettings
    from raydp_llm.engines.ray_cluster import ray_session

    # files: bad input is one line before Ray starts; a query's rows come from Spark on Ray
    s3 = S3Options.of(s.s3)
    chat, out = chat_template(s), s.out if storage.is_s3(s.out) else str(Path(s.out).absolute())
    table = None if s.data.query else claimed(read_prompts(s), s, out)
    with ray_session(ClusterSettings(), "generate"):
        if table is None:
            table = claimed(query_prompts(s), s, out)
        parts = math.ceil(table.num_rows / s.rows_per_part)
        todo = [p for p in range(parts) if not storage.exists(part_file(out, p), s3)]
        if todo:
            actors = s.actors or max(1, int(ray.cluster_resources().get("CPU", 1)))
            done = ray.data.from_items([{"part": p} for p in todo]).map_batches(
                Answerer, fn_constructor_args=(s, table, out, chat), batch_size=1,
                concurrency=min(actors, len(todo)), num_cpus=1)
            done.materialize()
    return {"rows": table.num_rows, "parts": parts, "answered": len(todo), "out": out}
