"""Batch answers (cli/answers.py): a model's answer to every row of a table of prompts (files, or a
Spark SQL query's rows), by Ray Data actors, into Parquet parts, the table read a part at a time.
Greedy answers equal one-prompt ``generate``'s, sampled ones too with the seed of the row's place
in the table; a job killed halfway (SIGKILL on the driver and all it started) and started again
writes every row exactly once; bad input is one line before Ray starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from deltalake import DeltaTable

from helpers.paths import ROOT
from helpers.s3 import BUCKET
from helpers.terminal import wait_for
from raydp_llm.checkpoint.model_dir import save_model_dir
from raydp_llm.cli.answers import answer, answer_table
from raydp_llm.cli.keyvalue import parse_args
from raydp_llm.core import storage
from raydp_llm.core.config import GenerateSettings, GPTConfig
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import CharTokenizer
from raydp_llm.models.factory import build_model
from raydp_llm.training.driver.generation import sample_text

pytestmark = pytest.mark.integration

PROMPTS = ["ROMEO: ", "JULIET: ", "To be, or not", "Now is the winter", "What light", "My lord",
           "Good night", "O Romeo, Romeo", "I am", "Sir, a word"]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    """A tiny untrained GPT (its answers are its arithmetic, not skill) and the prompts in
    Parquet, with a column of their own beside the prompt."""
    d = tmp_path_factory.mktemp("answers")
    tokenizer = CharTokenizer("".join(PROMPTS) + "abcdefghijklmnopqrstuvwxyz\n")
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1,
                                  n_head=2, n_embd=32))
    pq.write_table(pa.table({"id": list(range(len(PROMPTS))), "prompt": PROMPTS}),
                   d / "prompts.parquet", row_group_size=4)  # parts of 3 rows cross the groups
    return {"dir": d, "model": save_model_dir(d / "model", model, tokenizer), "net": model,
            "tokenizer": tokenizer}


def settings(job, out, *more: str) -> GenerateSettings:
    return parse_args(GenerateSettings, [f"model_dir={job['model']}",
                                         f"data.path={job['dir'] / 'prompts.parquet'}",
                                         f"out={out}", "max_new_tokens=12", "temperature=0",
                                         "rows_per_part=3", *more], required=("model_dir",))


def answers(out) -> pa.Table:
    return pq.read_table(sorted(out.glob("part-*.parquet"))).sort_by("id")


def test_greedy_answers_equal_one_prompt_generate(ray_cluster, job, tmp_path):
    done = answer_table(settings(job, tmp_path / "out", "actors=2"))
    assert (done["rows"], done["parts"], done["answered"]) == (10, 4, 4)
    table = answers(tmp_path / "out")
    assert table.column_names == ["id", "prompt", "completion", "completion_tokens",
                                  "mean_logprob"]
    assert table.column("id").to_pylist() == list(range(len(PROMPTS)))
    model = job["net"].eval()
    for row in table.to_pylist():
        alone = sample_text(model, job["tokenizer"], row["prompt"], 12, 0.0, None, 0)
        assert row["prompt"] + row["completion"] == alone
        assert row["completion_tokens"] == 12 and row["mean_logprob"] < 0
    again = answer_table(settings(job, tmp_path / "out", "actors=2"))
    assert again["answered"] == 0  # every part is there: nothing is answered twice


@pytest.mark.slow  # a Spark of its own (Hive's catalog)
def test_a_querys_rows_are_answered_as_the_same_rows_from_files(ray_cluster, job, tmp_path):
    """``data.query`` (Spark SQL over the prompts' Parquet file): the rows it selects, answered
    as the same rows of ``data.path``."""
    query = f"SELECT id, prompt FROM parquet.`{job['dir'] / 'prompts.parquet'}` WHERE id % 3 = 0"
    done = answer_table(parse_args(GenerateSettings, [
        f"model_dir={job['model']}", f"data.query={query}", f"out={tmp_path / 'q'}",
        "max_new_tokens=12", "temperature=0", "rows_per_part=3"], required=("model_dir",)))
    assert (done["rows"], done["parts"]) == (4, 2)
    from_query = answers(tmp_path / "q").to_pylist()
    assert [r["id"] for r in from_query] == [0, 3, 6, 9]
    model = job["net"].eval()
    for row in from_query:
        assert row["prompt"] + row["completion"] == sample_text(model, job["tokenizer"],
                                                                row["prompt"], 12, 0.0, None, 0)


def test_sampled_answers_depend_on_the_row_not_on_its_file_or_part(ray_cluster, job, tmp_path):
    """The prompts as two JSON Lines files (blank lines between rows), sampled (temperature 1): each
    row's answer is the one-prompt answer with the seed + its row number in the whole table,
    whatever file and part it lies in. A rerun after a file changed is one line."""
    given = tmp_path / "in"
    given.mkdir()
    rows = [{"id": i, "prompt": p} for i, p in enumerate(PROMPTS)]
    (given / "a.jsonl").write_text("\n\n".join(json.dumps(r) for r in rows[:4]) + "\n")
    (given / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[4:]))
    s = parse_args(GenerateSettings, [
        f"model_dir={job['model']}", f"data.path={given}", "data.format=jsonl",
        f"out={tmp_path / 'out'}", "max_new_tokens=12", "temperature=1.0", "rows_per_part=3",
        "actors=2"], required=("model_dir",))
    done = answer_table(s)
    assert (done["rows"], done["parts"]) == (10, 4)  # 4 rows: parts of 3 and 1; 6 rows: 3 and 3
    table = answers(tmp_path / "out").to_pylist()
    assert [r["id"] for r in table] == list(range(len(PROMPTS)))
    model, greedy = job["net"].eval(), 0
    for row in table:
        alone = answer(model, job["tokenizer"], row["prompt"], s, row["id"])
        assert row["completion"] == alone["completion"]
        assert row["mean_logprob"] == pytest.approx(alone["mean_logprob"], abs=1e-5)
        greedy += row["prompt"] + row["completion"] == sample_text(
            model, job["tokenizer"], row["prompt"], 12, 0.0, None, 0)
    assert greedy < len(PROMPTS)  # sampled indeed: the seeds count
    with (given / "b.jsonl").open("a") as f:
        f.write(json.dumps({"id": 10, "prompt": "Exit"}) + "\n")
    with pytest.raises(InputError, match=r"^data.path=.*: its files changed since the job in "
                                         r"out=.* began"):
        answer_table(s)


def test_prompts_on_s3_answered_into_s3(ray_cluster, job, s3, tmp_path):
    """``data.path`` and ``out`` as ``s3://`` URIs: the same answers as from local files, each part
    one object, and a rerun answers nothing twice."""
    storage.copy(job["dir"] / "prompts.parquet", f"s3://{BUCKET}/answers/in/p.parquet", s3)
    out = f"s3://{BUCKET}/answers/out"
    args = [f"model_dir={job['model']}", f"data.path=s3://{BUCKET}/answers/in/",
            f"out={out}", "max_new_tokens=12", "temperature=0", "rows_per_part=4",
            f"s3.endpoint_url={s3.endpoint_url}"]
    done = answer_table(parse_args(GenerateSettings, args, required=("model_dir",)))
    assert (done["rows"], done["parts"], done["answered"], done["out"]) == (10, 3, 3, out)
    keys = [f.base_name for f in storage.list_objects(out, s3)]
    assert keys == ["answers.json", "part-00000.parquet", "part-00001.parquet",
                    "part-00002.parquet", "prompts.json"]
    fs, path = storage.resolve(out, s3)
    rows = pq.read_table([f"{path}/{k}" for k in keys[1:4]], filesystem=fs).to_pylist()
    model = job["net"].eval()
    assert [r["id"] for r in rows] == list(range(len(PROMPTS)))
    for row in rows:
        assert row["prompt"] + row["completion"] == sample_text(model, job["tokenizer"],
                                                                row["prompt"], 12, 0.0, None, 0)
    again = answer_table(parse_args(GenerateSettings, args, required=("model_dir",)))
    assert again["answered"] == 0


@pytest.mark.slow  # two command-line jobs
def test_a_job_killed_halfway_and_started_again_writes_every_row_once(job, tmp_path):
    out, table = tmp_path / "out", tmp_path / "answers_table"
    args = [sys.executable, "-m", "raydp_llm.generate", f"model_dir={job['model']}",
            f"data.path={job['dir'] / 'prompts.parquet'}", f"out={out}", "max_new_tokens=200",
            "temperature=0", "rows_per_part=1", "actors=1", f"output.table={table}"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    wait_for(proc, lambda: len(list(out.glob("part-*.parquet"))) >= 2, "the second part", 180)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started, at once
    proc.wait()
    written = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    assert 2 <= len(written) < len(PROMPTS)
    rerun = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    table_rows = answers(out)
    assert table_rows.column("id").to_pylist() == list(range(len(PROMPTS)))  # each row once
    assert all(p.stat().st_mtime_ns == written[p.name]  # the parts done before stay as they were
               for p in out.glob("part-*.parquet") if p.name in written)
    # and appended to a Delta table once each, with the job's id (inputs/table_out.py)
    appended = DeltaTable(table).to_pyarrow_table().sort_by("id")
    assert appended.column("id").to_pylist() == list(range(len(PROMPTS)))
    assert appended.column("completion").to_pylist() == table_rows.column("completion").to_pylist()
    assert len(set(appended.column("answers_job").to_pylist())) == 1
    assert appended.column("model_table").null_count == len(PROMPTS)  # no table's model
    assert "appended to" in rerun.stdout


def test_bad_input_is_one_line(ray_cluster, job, tmp_path):
    with pytest.raises(InputError, match=r"^data.text_column=question: .* has no such column; "
                                         r"its columns: id, prompt$"):
        answer_table(settings(job, tmp_path / "a", "data.text_column=question"))
    answer_dir = tmp_path / "b"
    answer_dir.mkdir()
    (answer_dir / "answers.json").write_text('{"model_dir": "elsewhere"}')
    with pytest.raises(InputError, match=rf"^out={answer_dir} holds another job's answers"):
        answer_table(settings(job, answer_dir))
    (tmp_path / "lists.jsonl").write_text('["ROMEO: "]\n')
    with pytest.raises(InputError, match=r"lists.jsonl is not JSON Lines \(its first row is not "
                                         r"a JSON object\)"):
        answer_table(parse_args(GenerateSettings, [
            f"model_dir={job['model']}", f"data.path={tmp_path / 'lists.jsonl'}",
            "data.format=jsonl", f"out={tmp_path / 'c'}"], required=("model_dir",)))
    assert not (tmp_path / "c").exists()  # refused before anything is written
    # A column whose type changes down the file: refused by the file's index task, its own line.
    (tmp_path / "mixed.jsonl").write_text('{"prompt": "I am", "id": 1}\n'
                                          '{"prompt": "My lord", "id": "two"}\n')
    with pytest.raises(InputError, match=r"^.*mixed.jsonl: rows 0-1 do not read as one table with "
                                         r"the rows before \(.+\); give every line one JSON "
                                         r"object and each column one JSON type$"):
        answer_table(parse_args(GenerateSettings, [
            f"model_dir={job['model']}", f"data.path={tmp_path / 'mixed.jsonl'}",
            "data.format=jsonl", f"out={tmp_path / 'd'}"], required=("model_dir",)))
    assert not list((tmp_path / "d").glob("part-*"))
