"""S3 without AWS: a local S3-compatible server (moto, bound to 127.0.0.1; the ``s3`` fixture,
tests/fixtures/s3.py) stands in for it. The ETL reads ``s3://`` input in the executors, Ray Train
writes checkpoints to ``storage_path=s3://...``, runs resume from them, and text is generated from a
model on S3."""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
from dataclasses import replace

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from helpers.configs import make_config
from helpers.corpora import write_lines
from helpers.etl import prepare
from helpers.flaky_s3 import FlakyS3
from helpers.paths import ROOT
from helpers.s3 import BUCKET, glue_catalog
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.cli.train import run
from raydp_llm.core import integrity, storage
from raydp_llm.core.errors import InputError, RunFailure
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import load_tokenizer
from raydp_llm.data.etl.read import read_lines
from raydp_llm.data.etl.records import EtlPlan, Manifest
from raydp_llm.data.etl.run import run_etl
from raydp_llm.data.inputs import arrow_reader
from raydp_llm.data.inputs.files import resolve_corpus
from raydp_llm.data.inputs.tables import delta_location, iceberg_catalog, table_corpus
from raydp_llm.data.stream import RunWindows
from raydp_llm.engines.spark import spark_session
from raydp_llm.training.driver.metrics import read_metrics
from raydp_llm.training.driver.run import resume_checkpoint
from raydp_llm.training.spec import build_spec, samplings

# A run of four steps with checkpoints at 2 and 4, small enough for the S3 stand-in's pace.
TINY_RUN = [
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "model.block_size=32",
    "train.batch_size=8",
    "train.max_steps=4",
    "train.eval_interval=2",
    "train.checkpoint_interval=2",
    "train.eval_batches=2",
]
# the chunks handed from Spark to Ray's object store, as a run on a cluster without shared storage
FROM_SPARK = "data.cache=false"


def reference_lines(data: bytes) -> list[bytes]:
    """Lines as Spark's text source (Hadoop's LineReader) reads a whole file: \\n, \\r\\n or \\r end
    a line."""
    text = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return (text[:-1] if text.endswith(b"\n") else text).split(b"\n") if text else []


def test_byte_range_splits_read_every_line_exactly_once(monkeypatch):
    monkeypatch.setattr(arrow_reader, "READ_AHEAD", 3)  # lines longer than a read-ahead, too
    rng = random.Random(7)
    for _ in range(2000):
        data = bytes(rng.choice(b"ab\n\r") for _ in range(rng.randint(0, 60)))
        split = rng.randint(1, 17)
        lines = [
            line for _, start, end in arrow_reader.text_splits([("f", len(data))], split)
            for line in arrow_reader.lines_in_range(pa.BufferReader(data), len(data), start, end)
        ]
        assert lines == reference_lines(data), (data, split)
        # a compressed file is read whole, as a stream: the same lines
        assert arrow_reader.text_splits([("f.gz", len(data))], split) == [("f.gz", 0, -1)]
        assert list(arrow_reader.stream_lines(pa.BufferReader(data))) == reference_lines(data)


@pytest.mark.slow
def test_s3_corpora_are_listed_with_sizes_and_times(s3, corpus_dir):
    storage.copy(corpus_dir, f"s3://{BUCKET}/listed", s3)
    (corpus_dir.parent / "_SUCCESS").write_text("")  # Hadoop's marker objects are no input
    storage.copy(corpus_dir.parent / "_SUCCESS", f"s3://{BUCKET}/listed/_SUCCESS", s3)
    endpoint = f"s3.endpoint_url={s3.endpoint_url}"
    names = [f"s3://{BUCKET}/listed/part{i}.txt" for i in range(3)]
    for path in (
        f"s3://{BUCKET}/listed/", f"s3a://{BUCKET}/listed", f"s3://{BUCKET}/listed/part*.txt"
    ):
        corpus = check_inputs(make_config(f"data.path={path}", endpoint))
        assert corpus.files == names, path
        assert [f["size"] for f in corpus.fingerprints] == [
            (corpus_dir / f"part{i}.txt").stat().st_size for i in range(3)
        ]
        assert all(
            f["mtime_ns"] for f in corpus.fingerprints
        )  # with sizes: the ETL cache can key S3 input
    for path, message in [
        (f"s3://{BUCKET}/nothing/", f"data.path=s3://{BUCKET}/nothing/: no objects there"),
        ("s3://no-such-bucket/corpus/", "data.path=s3://no-such-bucket/corpus/: there is no "
                                        "bucket no-such-bucket"),
    ]:
        with pytest.raises(InputError, match=message.replace("(", r"\(")):
            check_inputs(make_config(f"data.path={path}", endpoint))
    with pytest.raises(InputError, match="train.storage_path=s3://no-such-bucket/runs: there is "
                                         "no bucket no-such-bucket; create it"):
        check_inputs(make_config("train.storage_path=s3://no-such-bucket/runs", endpoint))
    with pytest.raises(InputError, match=r"data.path=s3://b/x: cannot read it \(nothing answers "
                                         r"at s3.endpoint_url=http://127.0.0.1:9 \(.*\); check "
                                         r"its host and port\); check the URI, the AWS "
                                         r"credentials \(environment, ~/.aws, instance role\) "
                                         r"and s3.endpoint_url"):
        # nothing listens: refused at once, not after the SDK's 10 attempts (25 s of backoff)
        check_inputs(make_config("data.path=s3://b/x", "s3.endpoint_url=http://127.0.0.1:9"))


@pytest.mark.integration
def stream(chunks, index) -> bytes:
    """A split's token stream put together from its chunks (their own tokens, halos dropped):
    chunks are cut per piece, and pieces differ where the readers split files differently."""
    own = dict(zip(index.start.tolist(), (2 * index.n).tolist()))
    rows = sorted((r.start, bytes(r.tokens)) for r in chunks.collect())
    return b"".join(tokens[:own[start]] for start, tokens in rows)


def _etl_chunks(spark, cfg, path: str | None, data_format: str = "text", **data):
    """The ETL of ``path`` (or of the table ``data`` names): its manifest, each split's token
    stream, and the (file, block) pieces the readers cut."""
    settings = replace(cfg, data=replace(cfg.data, path=path, format=data_format, **data))
    out = run_etl(spark, EtlPlan.of(settings, check_inputs(settings)))
    blocks = sorted(
        {
            (r.src.rsplit("/", 1)[1], r.block)
            for r in out.encoded.select("src", "block").collect()
        }
    )
    manifest = out.manifest.to_json()
    return manifest, {n: stream(df, out.index[n]) for n, df in out.chunks.items()}, blocks


def _local_text_corpus_also_on_s3(corpus_dir, tmp_path, s3):
    """The corpus, a copy of one part with Windows line ends, and a gzipped part: on disk (the
    directory returned) and under s3://BUCKET/etl."""
    local = tmp_path / "corpus"
    local.mkdir()
    for f in corpus_dir.iterdir():
        (local / f.name).write_bytes(f.read_bytes())
    (local / "part3.txt").write_bytes(
        (corpus_dir / "part0.txt").read_bytes().replace(b"\n", b"\r\n")
    )  # Windows
    part1 = reference_lines((corpus_dir / "part1.txt").read_bytes())
    write_lines(local / "part4.txt.gz", [line.decode() for line in part1])  # Spark decompresses
    storage.copy(local, f"s3://{BUCKET}/etl", s3)
    return local


def _rows_as_parquet_and_jsonl_also_on_s3(rows: list[str], tmp_path, s3) -> list[str]:
    """The rows as one Parquet file and as four JSON-lines files (plain, .gz, .bz2, .zst; a broken
    line at the end), on disk and on S3; the JSON-lines files' names."""
    (tmp_path / "parquet").mkdir()
    pq.write_table(
        pa.table({"id": range(len(rows)), "text": rows}),
        tmp_path / "parquet" / "docs.parquet",
        row_group_size=20,
    )  # several row groups: several splits
    storage.copy(tmp_path / "parquet", f"s3://{BUCKET}/parquet", s3)
    (tmp_path / "jsonl").mkdir()
    json_lines = [json.dumps({"text": row}) for row in rows] + ["{broken"]
    names = [f"docs{i}.jsonl{suffix}" for i, suffix in enumerate(["", ".gz", ".bz2", ".zst"])]
    for i, name in enumerate(names):  # .zst: pyarrow's reader, from S3 and from disk
        write_lines(tmp_path / "jsonl" / name, json_lines[i::4])
    storage.copy(tmp_path / "jsonl", f"s3://{BUCKET}/jsonl", s3)
    return names


def _rows_as_tables_on_s3(rows: list[str], tmp_path, s3) -> dict:
    """The rows as a Delta table under s3:// (deltalake) and as an Iceberg table of a Glue catalog
    (moto's) with its warehouse on S3 (pyiceberg), as EMR users keep them: the settings that name
    each (``data.table``, and the catalog's properties)."""
    docs = pa.table({"id": range(len(rows)), "text": rows})
    delta = f"s3://{BUCKET}/delta-{tmp_path.name}/docs"
    target, options = delta_location(delta, s3)
    write_deltalake(target, docs, storage_options=options)
    properties = glue_catalog(s3, f"s3://{BUCKET}/warehouse-{tmp_path.name}")
    catalog = iceberg_catalog(properties)
    catalog.create_namespace("s3_docs")
    catalog.create_table("s3_docs.speeches", schema=docs.schema).append(docs)
    return {"delta": {"table": delta},
            "iceberg": {"table": "s3_docs.speeches", "catalog": properties}}


def _prompts_as_parquet_also_on_s3(tmp_path, s3) -> list[dict]:
    """A table of prompts with the columns rewards read (a list, a null among them), as Parquet
    on disk and under s3://BUCKET/prompts."""
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "id": i,
             "tags": ["sum", "é"] if i % 2 else None} for i in range(50)]
    (tmp_path / "prompts").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "prompts" / "p.parquet",
                   row_group_size=20)
    storage.copy(tmp_path / "prompts", f"s3://{BUCKET}/prompts", s3)
    # and as a Delta table under s3://BUCKET/prompts-table (GRPO's prompts from a table)
    target, options = delta_location(f"s3://{BUCKET}/prompts-table-{tmp_path.name}", s3)
    write_deltalake(target, pa.Table.from_pylist(rows), storage_options=options)
    return rows


def _prompt_rows(spark, cfg, path: str | None, table: str | None = None) -> list[dict]:
    """What the prompts' reader makes of the Parquet under ``path`` (or of the Delta ``table``'s
    snapshot): each row a JSON object."""
    data = replace(cfg.data, path=path, format="prompts", table=table)
    # its files listed as the door lists them (check_inputs would check them as the default
    # format's, text, and refuse the Parquet as binary, as the ETL does)
    if table is None:
        corpus = resolve_corpus(path, s3=S3Options.of(cfg.s3))
    else:
        corpus = table_corpus(data, S3Options.of(cfg.s3))
    lines = read_lines(spark, corpus, data, S3Options.of(cfg.s3))
    return sorted((json.loads(bytes(r.text)) for r in lines.collect()), key=lambda r: r["id"])


def _assert_text_from_s3_as_from_disk(from_s3, from_disk, local) -> None:
    assert max(block for _, block in from_s3[2]) > 0  # files were read as several byte ranges
    assert from_s3[2] == from_disk[2]  # ... the same ones as Spark's reader cuts
    assert from_s3[1] == from_disk[1]  # the same token stream, token for token
    same = (
        "files",
        "documents",
        "characters",
        "bytes",
        "tokens",
        "chunks_train",
        "chunks_val",
        "vocab_size",
    )
    assert {k: from_s3[0][k] for k in same} == {k: from_disk[0][k] for k in same}
    assert from_s3[0]["bytes"] == sum(f.stat().st_size for f in local.iterdir())


@contextlib.contextmanager
def _spark_sql_set(spark, key: str, value: str):
    """``key`` (a Spark SQL setting) at ``value`` for the duration, then back to what it was."""
    before = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.set(key, before)


@pytest.mark.slow
def test_the_etl_reads_s3_as_spark_reads_local_files(ray_cluster, s3, corpus_dir, tmp_path):
    local = _local_text_corpus_also_on_s3(corpus_dir, tmp_path, s3)
    cfg = make_config(
        "model.block_size=16",
        "data.stride=5",
        "data.cache=false",
        f"s3.endpoint_url={s3.endpoint_url}",
    )
    rows = [
        line
        for f in sorted(corpus_dir.iterdir())
        for line in f.read_text().split("\n\n")
        if line.strip()
    ]
    names = _rows_as_parquet_and_jsonl_also_on_s3(rows, tmp_path, s3)
    prompts = _prompts_as_parquet_also_on_s3(tmp_path, s3)
    tables = _rows_as_tables_on_s3(rows, tmp_path, s3)
    # the Spark the tests keep (its cluster settings: the defaults), with several input splits per
    # file for the length of this test: a setting Spark SQL takes at run time
    with spark_session(cfg.cluster, app_name="test_s3", log_dir=tmp_path / "spark") as spark, \
            _spark_sql_set(spark, "spark.sql.files.maxPartitionBytes", "8k"):
        from_s3 = _etl_chunks(spark, cfg, f"s3://{BUCKET}/etl/")
        from_disk = _etl_chunks(spark, cfg, str(local))
        parquet_from_s3 = _etl_chunks(spark, cfg, f"s3://{BUCKET}/parquet/", "parquet")
        parquet_from_disk = _etl_chunks(spark, cfg, str(tmp_path / "parquet"), "parquet")
        jsonl_from_s3 = _etl_chunks(spark, cfg, f"s3://{BUCKET}/jsonl/", "jsonl")
        jsonl_from_disk = _etl_chunks(spark, cfg, str(tmp_path / "jsonl"), "jsonl")
        prompts_from_s3 = _prompt_rows(spark, cfg, f"s3://{BUCKET}/prompts/")
        from_tables = {kind: _etl_chunks(spark, cfg, None, "parquet", **table)
                       for kind, table in tables.items()}
        prompts_from_disk = _prompt_rows(spark, cfg, str(tmp_path / "prompts"))
        prompts_from_table = _prompt_rows(spark, cfg, None,
                                          f"s3://{BUCKET}/prompts-table-{tmp_path.name}")
    _assert_text_from_s3_as_from_disk(from_s3, from_disk, local)
    assert len(parquet_from_s3[2]) > 1 and parquet_from_s3[0]["documents"] == len(
        rows
    )  # a document per row
    assert parquet_from_s3[1] == parquet_from_disk[1]
    assert jsonl_from_s3[1] == jsonl_from_disk[1]  # compressed or not, read alike
    assert jsonl_from_s3[0]["documents"] == len(rows)
    broken = names[len(rows) % 4]  # the file the last line went to
    assert jsonl_from_s3[0]["bad_json_lines"]["files"] == {f"s3://{BUCKET}/jsonl/{broken}": 1}
    # a Parquet table of prompts (chat, preference alike): its rows with every column, as JSON
    assert prompts_from_s3 == prompts_from_disk
    assert prompts_from_s3 == [{k: v for k, v in r.items() if v is not None} for r in prompts]
    assert prompts_from_table == prompts_from_s3  # GRPO's prompts from a Delta table on S3
    # a Delta table on S3 and an Iceberg table of a Glue catalog on S3: their snapshots' files
    # read as the same rows' Parquet file reads, and recorded
    for kind, (manifest, streams, _) in from_tables.items():
        assert streams == parquet_from_s3[1], kind
        assert manifest["documents"] == manifest["table"]["rows"] == len(rows), kind
        assert manifest["table"]["uri"] == tables[kind]["table"], kind


# a run's outputs, beside its checkpoints in storage_path
RUN_OUTPUTS = (
    "model/model.safetensors",
    "model/config.json",
    "model/tokenizer.json",
    "metrics.csv",
    "summary.json",
    "samples.txt",
    "loss.png",
)


def _assert_generation_from_s3_as_from_disk(tmp_path, run_uri: str, runs: str, s3) -> None:
    # Generation from the model on S3 gives the text generation from the local copy gives.
    local = generate(f"model_dir={tmp_path / 'first' / 'model'}")
    assert local.returncode == 0 and len(local.stdout) > 20, local.stderr
    remote = generate(f"model_dir={run_uri}/model", f"s3.endpoint_url={s3.endpoint_url}")
    assert remote.returncode == 0 and remote.stdout == local.stdout, remote.stderr
    missing = generate(f"model_dir={runs}/nothing/model", f"s3.endpoint_url={s3.endpoint_url}")
    assert missing.returncode == 2 and missing.stderr.strip() == (f"error: {runs}/nothing/model: "
                                                                  "no model.safetensors; give the "
                                                                  "model/ directory of a finished "
                                                                  "run")


@pytest.mark.integration
@pytest.mark.slow
def test_train_to_s3_resume_from_it_and_generate_from_it(ray_cluster, s3, corpus_dir, tmp_path):
    storage.copy(corpus_dir, f"s3://{BUCKET}/corpus", s3)
    runs = f"s3://{BUCKET}/runs"
    overrides = [
        "name=s3run",
        f"data.path=s3://{BUCKET}/corpus/",
        f"train.storage_path={runs}",
        f"s3.endpoint_url={s3.endpoint_url}",
        *TINY_RUN,
        "sample.max_new_tokens=40",
    ]
    # the first run's ETL goes to the cache (keyed by the objects' sizes and times), the resume's
    # reads it: Spark starts once
    first = run(make_config(*overrides), tmp_path / "first")
    run_uri = first["storage"]
    assert run_uri.startswith(f"{runs}/s3run-")
    fs, root = storage.resolve(run_uri, s3)
    states = {int(json.loads(storage.read_text(uri, s3))["step"]): uri.rsplit("/", 1)[0]
              for uri, _, _ in storage.find_files(run_uri, "train_state.json", s3)}
    assert sorted(states) == [2, 4]  # both checkpoints, written by Ray Train straight to S3
    for name in RUN_OUTPUTS:  # and the run's outputs beside them
        assert fs.get_file_info(f"{root}/{name}").type == pafs.FileType.File, name
    assert not (tmp_path / "first" / "ray_results").exists()

    # A resume from the step-2 checkpoint on S3 continues exactly as the first run went on.
    resumed = run(make_config(*overrides, f"train.resume={states[2]}"), tmp_path / "resumed")
    assert resumed["resumed_from"] == states[2] and resumed["etl"]["cache_hit"] is True
    rows = read_metrics(tmp_path / "resumed" / "metrics.csv")
    expected = read_metrics(tmp_path / "first" / "metrics.csv")
    assert [r["step"] for r in rows] == [4]
    assert rows[0]["val_loss"] == pytest.approx(expected[-1]["val_loss"], rel=1e-5)

    # train.resume=auto looks among the name's runs in storage_path: finished runs are not resumed;
    # a run whose last checkpoint is gone (as if it had been stopped after step 2) is.
    cfg = make_config(*overrides)
    manifest = json.loads((tmp_path / "first" / "manifest.json").read_text())
    spec = build_spec(cfg, load_tokenizer(tmp_path / "first" / "model"),
                      Manifest.from_json(manifest), RunWindows.from_json(manifest), samplings(cfg))
    assert resume_checkpoint(cfg, spec, tmp_path / "next") is None
    for uri in (resumed["storage"], states[4]):
        fs.delete_dir(storage.resolve(uri, s3)[1])
    assert resume_checkpoint(cfg, spec, tmp_path / "next") == states[2]
    _assert_generation_from_s3_as_from_disk(tmp_path, run_uri, runs, s3)


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raydp_llm.generate", *args, "prompt=ROMEO:", "max_new_tokens=30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
@pytest.mark.slow
def test_s3_that_flaps_is_retried_and_a_failed_final_copy_keeps_the_run(
    ray_cluster, s3, corpus_dir, tmp_path
):
    """Every 4th S3 request fails once (503 SlowDown) during the ETL's reads, Ray Train's checkpoint
    uploads and the final copy: each is retried and the run trains to its end, its checkpoints
    complete. The final copy of summary.json fails for good: one line names where the outputs are
    (complete) and how to copy them."""
    storage.copy(corpus_dir, f"s3://{BUCKET}/flaky-corpus", s3)
    runs = f"s3://{BUCKET}/flaky-runs"
    with FlakyS3(s3.endpoint_url, every=4, broken="/summary.json") as flaky:
        overrides = [
            "name=flaky",
            f"data.path=s3://{BUCKET}/flaky-corpus/",
            f"train.storage_path={runs}",
            f"s3.endpoint_url={flaky.endpoint}",
            "s3.max_attempts=6",
            *TINY_RUN,
            FROM_SPARK,
            "sample.max_new_tokens=20",
        ]
        with pytest.raises(RunFailure) as failure:
            run(make_config(*overrides), tmp_path / "run")
    out = tmp_path / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["storage"].startswith(f"{runs}/flaky-")
    assert str(failure.value).startswith("the run's outputs could not be copied to "
                                         f"{summary['storage']} (")
    assert str(failure.value).endswith(f"they are complete in {out}: copy them with `aws s3 cp "
                                       f"--recursive {out} {summary['storage']}`")
    assert integrity.problem(out / "model") is None and (out / "samples.txt").is_file()
    assert flaky.failed > 10  # transient faults were injected, and survived
    states = storage.find_files(summary["storage"], "train_state.json", s3)
    checkpoints = [uri.rsplit("/", 1)[0] for uri, _, _ in states]
    problems = {c: integrity.problem(c, s3) for c in checkpoints}  # None: complete
    assert len(problems) == 2 and set(problems.values()) == {None}, problems


def test_a_file_that_cannot_be_uploaded_fails_the_copy(s3, tmp_path):
    """Every UploadPart of one file fails: ``storage.write_tree`` (the final copy, Ray Train's
    checkpoint uploads) raises and writes no marker. pyarrow's ``copy_files`` returns as if the
    copy had succeeded, without the file."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a" * 1000)
    (tree / "sub" / "b.txt").write_text("b" * 1000)
    integrity.seal(tree)
    with FlakyS3(s3.endpoint_url, broken="/b.txt", methods=("PUT",)) as flaky:
        flaps = replace(s3, endpoint_url=flaky.endpoint, max_attempts=2)
        with pytest.raises(OSError, match="b.txt"):
            storage.publish(tree, f"s3://{BUCKET}/published", flaps)
    assert flaky.failed >= 2  # the SDK tried again
    assert storage.exists(f"s3://{BUCKET}/published/a.txt", s3)
    assert not storage.exists(f"s3://{BUCKET}/published/complete.json", s3)


def test_a_model_dir_on_s3_is_fetched_into_a_run_directory_that_has_no_model_dir_yet(s3, tmp_path):
    """evaluate fetches an s3:// model_dir into ``<run>/model``, which does not exist yet."""
    from raydp_llm.cli.evaluate_job import local_model_dir

    model = tmp_path / "trained"
    model.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        (model / name).write_text(name)
    storage.copy(model, f"s3://{BUCKET}/fetched/model", s3)
    settings = make_config(f"s3.endpoint_url={s3.endpoint_url}",
                           f"model_dir=s3://{BUCKET}/fetched/model", config_name="evaluate")
    assert local_model_dir(settings, tmp_path / "run") == tmp_path / "run" / "model"
    assert sorted(p.name for p in (tmp_path / "run" / "model").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json"]


@pytest.mark.integration
@pytest.mark.slow
def test_an_s3_object_that_cannot_be_read_is_one_line(ray_cluster, s3, corpus_dir, tmp_path):
    """Every read of one object fails in the executors (its listing works): after s3.max_attempts
    attempts per request and Spark's task retries, one line names the object."""
    storage.copy(corpus_dir / "part0.txt", f"s3://{BUCKET}/broken-corpus/a.txt", s3)
    storage.copy(corpus_dir / "part1.txt", f"s3://{BUCKET}/broken-corpus/broken.txt", s3)
    with FlakyS3(s3.endpoint_url, broken="/broken.txt", methods=("GET",)) as flaky:
        cfg = make_config(
            f"data.path=s3://{BUCKET}/broken-corpus/",
            f"s3.endpoint_url={flaky.endpoint}",
            "s3.max_attempts=2",
            "data.cache=false",
        )
        with pytest.raises(RunFailure, match=r"^data.path: the executors could not read from S3 "
                                             r"after s3.max_attempts=2 attempts: "
                                             rf"s3://{BUCKET}/broken-corpus/broken.txt: AWS Error "
                                             r".*; check the object, the bucket and "
                                             r"s3.endpoint_url"):
            prepare(cfg, check_inputs(cfg), tmp_path, to_ray=False, store=tmp_path / "dataset")
