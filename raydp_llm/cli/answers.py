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

import glob
import json
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from raydp_llm.core.config import GenerateSettings
from raydp_llm.core.errors import InputError

JOB_FILE = "answers.json"  # in out: the job whose parts it holds


def read_prompts(s: GenerateSettings) -> pa.Table:
    """Every row of ``data.path`` (files sorted by name), its prompt column checked."""
    given = s.data.path
    pattern = os.path.join(given, "*") if os.path.isdir(given) else given
    suffix = (".parquet",) if s.data.format == "parquet" else (".jsonl", ".json")
    files = sorted(f for f in glob.glob(pattern) if f.endswith(suffix))
    if not files:
        raise InputError(f"data.path={given}: no {' or '.join(suffix)} files there; give the "
                         f"prompts as data.format={s.data.format} files")
    read = pq.read_table if s.data.format == "parquet" else pj.read_json
    table = pa.concat_tables([read(f) for f in files], promote_options="default")
    if s.data.text_column not in table.column_names:
        raise InputError(f"data.text_column={s.data.text_column}: {given} has no such column; "
                         f"its columns: {', '.join(table.column_names)}")
    return table


def job_identity(s: GenerateSettings, rows: int) -> dict:
    """What makes ``out``'s parts this job's: the model, the prompts, the sampling, the parts."""
    return {"model_dir": s.model_dir, "data": {"path": s.data.path, "format": s.data.format,
                                               "text_column": s.data.text_column},
            "rows": rows, "rows_per_part": s.rows_per_part, "max_new_tokens": s.max_new_tokens,
            "temperature": s.temperature, "top_k": s.top_k, "seed": s.seed}


def claim_out(out: Path, identity: dict) -> None:
    """``out`` is new, or holds this job's parts (a rerun continues it); another job's output is
    one line, nothing touched."""
    record = out / JOB_FILE
    if record.is_file():
        found = json.loads(record.read_text())
        if found != identity:
            differs = sorted(k for k in identity if found.get(k) != identity[k])
            raise InputError(f"out={out} holds another job's answers ({', '.join(differs)} "
                             "differ); give a new out, or the same settings to continue it")
        return
    if out.exists() and any(out.iterdir()):
        raise InputError(f"out={out} is not empty and holds no answers job ({JOB_FILE}); give a "
                         "new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(identity, indent=1))


def part_file(out: Path, part: int) -> Path:
    return out / f"part-{part:05d}.parquet"


class Answerer:
    """Ray Data's actor: the model loaded once; a batch of part numbers in, each part's rows
    answered and written, their row counts out."""

    def __init__(self, s: GenerateSettings, table: pa.Table, out: str):
        import torch

        from raydp_llm.checkpoint.model_dir import load_model_dir
        from raydp_llm.core.storage import S3Options

        torch.set_num_threads(1)  # an actor per CPU
        self.s, self.table, self.out = s, table, Path(out)
        self.model, self.tokenizer = load_model_dir(s.model_dir, s3=S3Options.of(s.s3))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = [self.write_part(int(p)) for p in batch["part"]]
        return {"part": batch["part"], "rows": np.array(rows, dtype=np.int64)}

    def write_part(self, part: int) -> int:
        first = part * self.s.rows_per_part
        rows = self.table.slice(first, self.s.rows_per_part)
        answers = [answer(self.model, self.tokenizer, str(prompt), self.s, first + i)
                   for i, prompt in enumerate(rows.column(self.s.data.text_column).to_pylist())]
        for name in ("completion", "completion_tokens", "mean_logprob"):
            rows = rows.append_column(name, pa.array([a[name] for a in answers]))
        tmp = self.out / f".part-{part:05d}.tmp"
        pq.write_table(rows, tmp)
        tmp.replace(part_file(self.out, part))  # whole or absent: a killed run leaves no part
        return rows.num_rows


def answer(model, tokenizer, prompt: str, s: GenerateSettings, row: int) -> dict:
    """The model's continuation of ``prompt`` as ``generate`` samples it for one prompt (the
    seed: ``s.seed`` + ``row``): its text, its tokens and their mean log-probability."""
    import torch

    from raydp_llm.training.generation import prompt_ids

    idx = prompt_ids(model, tokenizer, prompt)
    gen = torch.Generator(device=idx.device).manual_seed(s.seed + row)
    logprobs: list = []
    with torch.no_grad():
        out = model.generate(idx, s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                             generator=gen, logprobs=logprobs)
    new = out[0, idx.size(1):].tolist()
    mean = torch.stack(logprobs).mean().item() if logprobs else math.nan
    return {"completion": tokenizer.decode(new), "completion_tokens": len(new),
            "mean_logprob": mean}


def answer_table(s: GenerateSettings) -> dict:
    """Every prompt of ``data.path`` answered into ``out`` (the parts it lacks); what was done."""
    import ray
    import ray.data

    from raydp_llm.core.config import ClusterSettings
    from raydp_llm.engines.ray_cluster import ray_session

    table = read_prompts(s)
    out = Path(s.out).absolute()
    claim_out(out, job_identity(s, table.num_rows))
    parts = math.ceil(table.num_rows / s.rows_per_part)
    todo = [p for p in range(parts) if not part_file(out, p).exists()]
    with ray_session(ClusterSettings(), "generate"):
        if todo:
            actors = s.actors or max(1, int(ray.cluster_resources().get("CPU", 1)))
            done = ray.data.from_items([{"part": p} for p in todo]).map_batches(
                Answerer, fn_constructor_args=(s, table, str(out)), batch_size=1,
                concurrency=min(actors, len(todo)), num_cpus=1)
            done.materialize()
    return {"rows": table.num_rows, "parts": parts, "answered": len(todo), "out": str(out)}
