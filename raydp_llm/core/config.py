"""The configuration's schema: every setting's type, default and meaning, and the checks types
cannot make.

Hydra composes ``conf/*.yaml`` onto these dataclasses (registered in its ConfigStore on import), so
a wrong type or an unknown key fails while composing, with Hydra's own error. The entry points turn
the composed config into these typed objects once (``OmegaConf.to_object``); from there on the code
reads them, never the config. ``validate`` then checks ranges, choices and settings that must agree,
before Ray or Spark start. Each field's ``help`` is printed beside it by ``--help`` and ``--cfg
job`` (raydp_llm/cli/help.py).
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from raydp_llm.core.errors import InputError
from raydp_llm.core.model_config import (  # noqa: F401 - the model group, re-exported
    MODEL_CONFIGS,
    GPTConfig,
    LSTMConfig,
    ModelConfig,
    model_config,
    setting,
)

# conf/ beside the package (a checkout, an editable install), else the copy a wheel installs
# (pyproject.toml's data-files): Hydra takes this absolute path as the entry points' config_path.
_CHECKOUT_CONF = Path(__file__).resolve().parents[2] / "conf"
CONF_DIR = str(_CHECKOUT_CONF if (_CHECKOUT_CONF / "config.yaml").is_file()
               else Path(sys.prefix) / "share" / "raydp_llm" / "conf")


@dataclass
class FilterSettings:
    """Quality filters on whole documents, each off while null; a document failing any is dropped
    before deduplication. The Gopher rules (Rae et al. 2021, appendix A.1.1) with the thresholds
    that paper used in each help; docs/data-curation.md has the origin of each."""

    min_words: Optional[int] = setting(None, "drop documents of fewer words (Gopher: 50)")
    max_words: Optional[int] = setting(None, "drop documents of more words (Gopher: 100000)")
    max_non_alpha_words: Optional[float] = setting(None, "drop documents whose share of words "
                                                         "without a letter is above this "
                                                         "(Gopher: 0.2)")
    max_symbol_word_ratio: Optional[float] = setting(None, "drop documents with more '#' and "
                                                           "ellipses per word (Gopher: 0.1)")
    max_dup_lines: Optional[float] = setting(None, "drop documents whose share of lines that "
                                                   "repeat an earlier line is above this "
                                                   "(Gopher: 0.3)")
    max_dup_line_chars: Optional[float] = setting(None, "the same, counted in characters "
                                                        "(Gopher: 0.2)")
    max_top_2gram_chars: Optional[float] = setting(None, "drop documents whose most frequent word "
                                                         "2-gram covers more of the characters "
                                                         "(Gopher: 0.2)")
    max_dup_5gram_chars: Optional[float] = setting(None, "drop documents whose repeated word "
                                                         "5-grams cover more of the characters "
                                                         "(Gopher: 0.15)")
    max_mean_line_length: Optional[float] = setting(None, "drop documents whose mean non-blank "
                                                          "line is longer, in characters "
                                                          "(minified code, data dumps; The "
                                                          "Stack: 100)")
    score_path: Optional[str] = setting(None, "a Parquet file of document scores (evaluate "
                                              "per_document=true): with max_score or "
                                              "max_score_quantile, drop the documents the model "
                                              "found least plausible")
    max_score: Optional[float] = setting(None, "drop scored documents whose mean loss is above "
                                               "this")
    max_score_quantile: Optional[float] = setting(None, "drop scored documents above this "
                                                        "quantile of the mean loss, in (0, 1]")


@dataclass
class DataSettings:
    path: Any = setting(None, "file, directory, glob or URI (s3:// or s3a:// object, prefix or "
                              "glob; hdfs://), or a list of them; null = the built-in sample "
                              "corpus")
    markdown: bool = setting(False, "strip markdown markup from data.path files (the sample is "
                                    "always stripped)")
    max_files: Optional[int] = setting(None, "use only the first N files (sorted by path); null = "
                                             "all")
    document_split: str = setting("file", "where documents end: file | blank_line | line "
                                          "(an end-of-document token joins them)")
    sampling: str = setting("stride", "how training windows are cut from the token stream: stride "
                                      "(every data.stride tokens) | random (seeded random "
                                      "offsets, nanoGPT's sampling; as many per epoch as a stride "
                                      "of model.block_size gives)")
    stride: Optional[int] = setting(None, "tokens between training window starts; null = "
                                          "model.block_size (no overlap); smaller = overlapping "
                                          "windows (no new ETL: windows are cut when read)")
    val_stride: Optional[int] = setting(None, "the same for validation windows; null = "
                                              "model.block_size (every token scored once)")
    chunk_tokens: int = setting(262144, "tokens per stored chunk of the stream: the unit a worker "
                                        "reads")
    halo_tokens: int = setting(1024, "tokens stored after each chunk, so windows are cut from one "
                                     "chunk: the largest model.block_size the ETL output serves")
    split: str = setting("tail", "tail = the last val_fraction of the token stream is validation "
                                 "(nanoGPT) | hash = seeded chunks")
    val_fraction: float = setting(0.1, "fraction of tokens held out for validation, in (0, 1)")
    segment_tokens: int = setting(8192, "hash split: tokens per chunk assigned to train or "
                                        "validation")
    skip_binary: bool = setting(False, "skip files with NUL bytes (with a warning) instead of "
                                       "failing")
    strict_utf8: bool = setting(False, "fail on invalid UTF-8 instead of replacing (and counting) "
                                       "it")
    cache: bool = setting(True, "reuse the ETL output of an earlier run with the same inputs and "
                                "settings (skips Spark)")
    cache_dir: str = setting("${oc.env:HOME}/.cache/raydp_llm/etl", "where ETL outputs are kept "
                                                                    "(Parquet + tokenizer + "
                                                                    "manifest)")
    format: str = setting("text", "text | ids (lines of whitespace-separated integer token ids) | "
                                  "parquet (a text column) | jsonl (JSON Lines: an object per "
                                  "line); text, ids and jsonl files may be .gz, .bz2 or .zst")
    text_column: str = setting("text", "parquet and jsonl: the column or field holding the text; "
                                       "each row or line is a document")
    strict_json: bool = setting(False, "jsonl: fail on the first bad line (not JSON, no "
                                       "data.text_column, not a string), naming its file and line, "
                                       "instead of skipping it (bad lines are counted in "
                                       "manifest.json)")
    vocab_size: Optional[int] = setting(None, "ids: the vocabulary size; null = the largest id + 1")
    dedup: str = setting("none", "none | exact (documents equal after normalizing: kept once) | "
                                 "near (MinHash LSH: one of each cluster of near duplicates)")
    dedup_threshold: float = setting(0.8, "near: the Jaccard similarity of shingle sets from "
                                          "which two documents are duplicates, in (0, 1]")
    dedup_shingle: str = setting("word", "near: shingles of words | char (characters)")
    dedup_ngram: int = setting(5, "near: words (or characters) per shingle")
    dedup_num_perm: int = setting(128, "near: MinHash functions per signature")
    dedup_lowercase: bool = setting(True, "exact: compare documents case-folded")
    dedup_whitespace: bool = setting(True, "exact: compare documents with runs of white space as "
                                           "one space, ends stripped")
    filters: FilterSettings = setting(FilterSettings(), "quality filters, each off while null")
    decontaminate: str = setting("report", "report (count validation documents sharing an "
                                           "n-gram with training documents) | remove (and drop "
                                           "those training documents) | off (it costs about 5 s "
                                           "on a small corpus, 0.7-1.2x the rest of the ETL at "
                                           "25-100 MB on 2 cores); text formats only")
    decontaminate_ngram: int = setting(13, "words per n-gram of the contamination check (GPT-3: "
                                           "13)")


@dataclass
class CharTokenizerSettings:
    kind: str = setting("char", "char | bpe (pick the option tokenizer=bpe rather than overriding "
                                "this)")
    path: Optional[str] = setting(None, "an existing tokenizer.json to use instead of building "
                                        "one from the corpus")


@dataclass
class BPETokenizerSettings(CharTokenizerSettings):
    kind: str = "bpe"
    vocab_size: int = setting(4096, "ids, including the end-of-document token <|endoftext|>; at "
                                    "least 257")
    sample_mb: float = setting(32, "MB of text sampled (by Spark, seeded) to train the BPE on")


@dataclass
class OptimSettings:
    lr: float = setting(1e-3, "peak learning rate, > 0")
    min_lr: float = setting(1e-4, "learning rate at the end of the cosine decay, in [0, lr]")
    warmup_steps: int = setting(100, "optimizer steps of linear warmup")
    weight_decay: float = setting(0.1, "AdamW weight decay, applied to weight matrices only")
    beta1: float = setting(0.9, "AdamW beta1, in [0, 1)")
    beta2: float = setting(0.99, "AdamW beta2, in [0, 1)")
    grad_clip: float = setting(1.0, "max gradient norm; 0 = no clipping")


@dataclass
class TrainSettings:
    num_workers: int = setting(2, "DDP workers (Ray Train actors); with min_workers, the most")
    min_workers: Optional[int] = setting(None, "elastic training: the fewest DDP workers to train "
                                               "with (Ray Train starts as many as fit, up to "
                                               "num_workers, and grows the group as nodes come "
                                               "back); null = exactly num_workers")
    max_failures: int = setting(3, "lost workers (a crash, a lost node) a run survives: Ray Train "
                                   "restarts the worker group from the last checkpoint; 0 = fail "
                                   "at the first")
    cpus_per_worker: int = setting(1, "Ray CPUs per worker; also its torch thread count")
    use_gpu: bool = setting(False, "one GPU per worker")
    batch_size: int = setting(12, "windows per optimizer step, over all workers and accumulation "
                                  "steps")
    grad_accum: int = setting(1, "micro-batches accumulated per optimizer step "
                                 "(batch_size divisible by num_workers × grad_accum)")
    max_steps: int = setting(3000, "optimizer steps (ignored when epochs is set)")
    epochs: Optional[int] = setting(None, "passes over the training windows; null = train for "
                                          "max_steps")
    eval_interval: int = setting(250, "steps between evaluations (a metrics.csv row each)")
    eval_batches: Optional[int] = setting(50, "validation micro-batches per worker per evaluation; "
                                              "null = the whole validation split")
    checkpoint_interval: int = setting(1000, "steps between checkpoints, a multiple of "
                                             "eval_interval; 0 = only the final one")
    keep_checkpoints: int = setting(2, "checkpoints kept per run (the latest ones)")
    resume: str = setting("auto", "auto = continue the latest unfinished checkpoint of an "
                                  "identical run | never | a checkpoint dir (local or s3://)")
    storage_path: Optional[str] = setting(None, "where Ray Train writes checkpoints, and the "
                                                "run's outputs are copied when it ends "
                                                "(<storage_path>/<run>/): a directory or "
                                                "s3://bucket/prefix; null = ray_results/ in the "
                                                "run directory")
    precision: str = setting("auto", "auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16")
    compile: bool = setting(False, "torch.compile the model (worth it on GPUs)")
    peak_flops: Optional[float] = setting(None, "one worker's peak FLOP/s for MFU (e.g. 989e12 "
                                                "for an H100's bf16); null = no MFU")


@dataclass
class ClusterSettings:
    address: str = setting("local", "local = start an embedded Ray; otherwise a Ray address "
                                    "(auto, ray://host:10001, host:6379)")
    num_cpus: Optional[int] = setting(None, "CPUs the embedded Ray may use; null = all")
    object_store_mb: Optional[int] = setting(1024, "embedded Ray object store size, MiB; null = "
                                                   "Ray's default")
    dashboard: bool = setting(True, "start the Ray dashboard with the embedded Ray (token "
                                    "authentication on)")
    dashboard_host: str = setting("127.0.0.1", "address the embedded Ray's dashboard listens on; "
                                               "127.0.0.1 = this machine only (from elsewhere: an "
                                               "SSH tunnel)")
    dashboard_port: Optional[int] = setting(None, "the dashboard's port; null = 8265, or the next "
                                                  "free one")
    spark_ui: bool = setting(False, "start Spark's web UI during the ETL and print its URL")
    verbose: bool = setting(False, "show Ray, Spark and Java logs on the console")
    executors: int = setting(2, "Spark executors (Ray actors)")
    executor_cores: int = setting(1, "Spark task slots per executor")
    executor_ray_cpus: float = setting(0.5, "Ray CPUs each executor actor reserves (below "
                                            "executor_cores leaves Ray room beside Spark)")
    executor_memory: str = setting("1g", "JVM heap per executor")
    keep_executors: bool = setting(False, "keep Spark running through training (its Ray CPUs stay "
                                          "taken); false = stop it after the hand-off")
    driver_memory: str = setting("1g", "Spark driver JVM heap")
    quick_jvm: bool = setting(True, "Spark's JVMs compile with C1 alone (-XX:TieredStopAtLevel=1): "
                                    "ready ~8 s sooner on 2 cores, the same ETL speed; false for "
                                    "hours-long ETLs on many cores")
    spark_conf: Dict[str, Any] = setting({}, "extra Spark settings, e.g. "
                                             "{spark.sql.shuffle.partitions: 8}")
    placement: Optional[str] = setting(None, "where Ray puts the Spark executors and the DDP "
                                             "workers: null = Ray's default | PACK | SPREAD (over "
                                             "the nodes, as far as possible) | STRICT_SPREAD "
                                             "(each on a node of its own)")
    worker_nodes: int = setting(1, "nodes that run executors and DDP workers; "
                                   "conf/cluster/emr.yaml sizes the job per node from it")
    node_cpus: Optional[int] = setting(None, "Ray CPUs of each such node (EMR: the instance's "
                                             "vCPUs - 1); conf/cluster/emr.yaml sizes the job per "
                                             "node from it")


@dataclass
class S3Settings:
    endpoint_url: Optional[str] = setting(None, "an S3-compatible service instead of AWS, e.g. "
                                                "http://127.0.0.1:9000 (MinIO); null = AWS")
    region: Optional[str] = setting(None, "the buckets' AWS region; null = from AWS_REGION, "
                                          "~/.aws/config or the instance")
    max_attempts: int = setting(10, "attempts per S3 request (exponential backoff from 25 ms) "
                                    "before it fails: S3 answers SlowDown or 5xx under load")


@dataclass
class SampleSettings:
    prompt: str = setting("\n", "text the sample continues")
    max_new_tokens: int = setting(600, "tokens to generate")
    temperature: float = setting(0.8, "softmax temperature; 0 = greedy")
    top_k: Optional[int] = setting(50, "sample among the k most likely tokens; null = all")


@dataclass
class TrackingSettings:
    kind: str = setting("none", "none | mlflow (pick the option tracking=mlflow rather than "
                                "overriding this)")
    uri: Optional[str] = setting(None, "mlflow: the tracking server (http://host:5000) or store "
                                       "URI; null = a local store, outputs/mlflow.db (nothing to "
                                       "start; browse it with `mlflow ui --backend-store-uri "
                                       "sqlite:///outputs/mlflow.db`)")
    experiment: str = setting("raydp_llm", "mlflow: the experiment the runs are logged under")
    log_model: bool = setting(True, "mlflow: log model/ among the artifacts (false: metrics, "
                                    "plots and the JSON files only)")


@dataclass
class Settings:
    name: str = setting("raydp_llm", "run name: the Spark app, the Ray Train run and the output "
                                     "folder carry it")
    required: List[str] = setting([], "settings this configuration cannot run without, e.g. "
                                      "[data.path] for a corpus not shipped here; each must be "
                                      "given")
    seed: int = setting(1337, "seeds model init, data order, window shuffle and sampling")
    data: DataSettings = setting(DataSettings(), "the corpus and how the ETL cuts it into "
                                                 "training windows")
    tokenizer: Any = setting(MISSING, "char | bpe: how text becomes token ids")
    model: Any = setting(MISSING, "the language model: gpt | gpt_nano | gpt_mini | gpt2_small | "
                                  "lstm")
    optim: OptimSettings = setting(OptimSettings(), "AdamW with linear warmup and cosine decay")
    train: TrainSettings = setting(TrainSettings(), "Ray Train: DDP workers, batches, steps, "
                                                    "evaluation, checkpoints")
    cluster: ClusterSettings = setting(ClusterSettings(), "Ray, and Spark on it with RayDP")
    sample: SampleSettings = setting(SampleSettings(), "text generated into samples.txt after "
                                                       "training")
    s3: S3Settings = setting(S3Settings(), "S3 access for s3:// data, storage and checkpoints; "
                                           "credentials come from the standard AWS chain "
                                           "(environment, ~/.aws, instance role)")
    tracking: TrackingSettings = setting(TrackingSettings(), "experiment tracking: none | mlflow "
                                                             "(settings, metrics, outputs)")


@dataclass
class GenerateSettings(SampleSettings):
    """``python -m raydp_llm.generate``: the sample settings, and what the command needs beside
    them."""

    max_new_tokens: int = 600
    model_dir: Optional[str] = setting(None, "the model/ directory of a finished run, or its "
                                             "s3:// URI (required)")
    seed: int = setting(1337, "seeds the sampling: the same seed gives the same text")
    show_top: int = setting(0, "also print the N likeliest tokens right after the prompt, with "
                               "their probabilities")
    s3: S3Settings = setting(S3Settings(), "S3 access for an s3:// model_dir")


@dataclass
class ExportSettings:
    """``python -m raydp_llm.export``: a model directory to Hugging Face's GPT-2 format."""

    model_dir: Optional[str] = setting(None, "the model/ directory of a finished run (a GPT), or "
                                             "its s3:// URI (required)")
    out: Optional[str] = setting(None, "the directory to write: new, or empty (required)")
    s3: S3Settings = setting(S3Settings(), "S3 access for an s3:// model_dir")


@dataclass
class EvaluateSettings(Settings):
    name: str = "evaluate"
    model_dir: Optional[str] = setting(None, "the model/ directory of a finished run (required)")
    eval_batch_size: int = setting(32, "windows per forward pass")
    per_document: bool = setting(False, "also score every document on the cluster (Ray Data, an "
                                        "actor per CPU) into document_scores.parquet: path, "
                                        "doc, val, tokens, mean_loss; a later ETL filters with "
                                        "it (data.filters.score_path)")


# ``${uid:}``: six random hex digits, the same wherever one config reads it (the resolver's cache).
# It ends the run and sweep directory names (conf/config.yaml): two runs started in the same second
# get their own.
OmegaConf.register_new_resolver("uid", lambda: secrets.token_hex(3), use_cache=True, replace=True)

SCHEMAS = {  # ConfigStore (group, name) → schema; conf/ files name them in their defaults lists
    (None, "base_config"): Settings,
    (None, "base_evaluate"): EvaluateSettings,
    ("model", "base_gpt"): GPTConfig,
    ("model", "base_lstm"): LSTMConfig,
    ("tokenizer", "base_char"): CharTokenizerSettings,
    ("tokenizer", "base_bpe"): BPETokenizerSettings,
}
for (_group, _name), _schema in SCHEMAS.items():
    ConfigStore.instance().store(group=_group, name=_name, node=_schema)


# ------------------------------------------------------------------------------------- checks
def _at_least(low):
    return lambda v: v >= low, f"a number ≥ {low}"


def _optional(rule):
    test, allowed = rule
    return lambda v: v is None or test(v), f"null or {allowed}"


def _one_of(*choices):
    return lambda v: v in choices, " | ".join(choices)


def _within(low, high):
    return lambda v: low <= v < high, f"a number in [{low}, {high})"


# key → (test, what is allowed); keys a config lacks (e.g. model.n_head of an LSTM) are skipped
RULES = {
    "data.max_files": _optional(_at_least(1)),
    "data.document_split": _one_of("file", "blank_line", "line"),
    "data.sampling": _one_of("stride", "random"),
    "data.stride": _optional(_at_least(1)),
    "data.val_stride": _optional(_at_least(1)),
    "data.split": _one_of("tail", "hash"),
    "data.val_fraction": (lambda v: 0 < v < 1, "a fraction strictly between 0 and 1"),
    "data.segment_tokens": _at_least(1),
    "data.chunk_tokens": _at_least(1),
    "data.halo_tokens": _at_least(1),
    "data.format": _one_of("text", "ids", "parquet", "jsonl"),
    "data.vocab_size": _optional(_at_least(1)),
    "data.dedup": _one_of("none", "exact", "near"),
    "data.dedup_threshold": (lambda v: 0 < v <= 1, "a similarity in (0, 1]"),
    "data.dedup_shingle": _one_of("word", "char"),
    "data.dedup_ngram": _at_least(1),
    "data.dedup_num_perm": _at_least(2),
    "data.decontaminate": _one_of("report", "remove", "off"),
    "data.decontaminate_ngram": _at_least(1),
    "data.filters.min_words": _optional(_at_least(0)),
    "data.filters.max_words": _optional(_at_least(1)),
    "data.filters.max_score_quantile": _optional((lambda v: 0 < v <= 1, "a quantile in (0, 1]")),
    "tokenizer.kind": _one_of("char", "bpe"),
    "tracking.kind": _one_of("none", "mlflow"),
    "tokenizer.vocab_size": (
        lambda v: v >= 257,
        "an integer ≥ 257 (256 bytes + the end-of-document token)",
    ),
    "tokenizer.sample_mb": (lambda v: v > 0, "a number > 0"),
    "model.n_layer": _at_least(1),
    "model.n_head": _at_least(1),
    "model.n_embd": _at_least(1),
    "model.block_size": _at_least(1),
    "model.dropout": _within(0, 1),
    "optim.lr": (lambda v: v > 0, "a number > 0"),
    "optim.min_lr": _at_least(0),
    "optim.warmup_steps": _at_least(0),
    "optim.weight_decay": _at_least(0),
    "optim.beta1": _within(0, 1),
    "optim.beta2": _within(0, 1),
    "optim.grad_clip": _at_least(0),
    "train.num_workers": _at_least(1),
    "train.min_workers": _optional(_at_least(1)),
    "train.max_failures": (lambda v: v >= -1, "-1 (no limit) or a number ≥ 0"),
    "train.cpus_per_worker": (lambda v: v > 0, "a number > 0"),
    "train.batch_size": _at_least(1),
    "train.grad_accum": _at_least(1),
    "train.max_steps": _at_least(1),
    "train.epochs": _optional(_at_least(1)),
    "train.eval_interval": _at_least(1),
    "train.eval_batches": _optional(_at_least(1)),
    "train.checkpoint_interval": _at_least(0),
    "train.keep_checkpoints": _at_least(1),
    "train.precision": _one_of("auto", "fp32", "bf16"),
    "train.peak_flops": _optional((lambda v: v > 0, "a number > 0")),
    "cluster.num_cpus": _optional((lambda v: v > 0, "a number > 0")),
    "cluster.executors": _at_least(1),
    "cluster.executor_cores": _at_least(1),
    "cluster.executor_ray_cpus": (
        lambda v: 0 < v <= 1 or v == int(v),
        "a number in (0, 1] or a whole number (Ray's Java actors take no other fractions)",
    ),
    "cluster.dashboard_port": _optional((lambda v: 0 < v < 65536, "a port number, 1-65535")),
    "cluster.placement": _optional(_one_of("PACK", "SPREAD", "STRICT_SPREAD")),
    "cluster.worker_nodes": _at_least(1),
    "cluster.node_cpus": _optional(_at_least(1)),
    "s3.max_attempts": _at_least(1),
    "s3.endpoint_url": _optional(
        (lambda v: v.startswith(("http://", "https://")), "an http:// or https:// URL")
    ),
    "sample.max_new_tokens": _at_least(0),
    "sample.temperature": _at_least(0),
    "sample.top_k": _optional(_at_least(1)),
}


def select(settings, key: str, default: Any = None) -> Any:
    """The setting at a dotted ``key`` (``train.num_workers``), or ``default`` when the settings
    have none."""
    node = settings
    for part in key.split("."):
        if not hasattr(node, part):
            return default
        node = getattr(node, part)
    return node


def validate(settings: Settings) -> None:
    """Raise ``InputError`` (key, bad value, what is allowed) for the first setting out of range,
    the first pair that disagrees, or a cluster too small for the job. Needs no engine: runs before
    Ray or Spark start."""
    for key in settings.required:
        if select(settings, key) is None:
            raise InputError(f"{key} is missing: the {settings.name} configuration needs it; add "
                             f"{key}=...")
    missing = object()
    for key, (test, allowed) in RULES.items():
        value = select(settings, key, missing)
        if value is not missing and not test(value):
            raise InputError(f"{key}={value} is not allowed: use {allowed}")
    t, o, c = settings.train, settings.optim, settings.cluster
    if o.min_lr > o.lr:
        raise InputError(f"optim.min_lr={o.min_lr} is above optim.lr={o.lr}; the decay ends at "
                         "min_lr ≤ lr")
    _check_batch(t)
    _check_score_filter(settings.data.filters)
    if settings.model.block_size > settings.data.halo_tokens:
        raise InputError(f"model.block_size={settings.model.block_size} is above "
                         f"data.halo_tokens={settings.data.halo_tokens}, the longest window the "
                         "ETL output serves; set data.halo_tokens to at least the block size")
    if t.checkpoint_interval % t.eval_interval:
        raise InputError(f"train.checkpoint_interval={t.checkpoint_interval} is not a multiple of "
                         f"train.eval_interval={t.eval_interval}; checkpoints are taken at "
                         "evaluations")
    if (
        c.address == "local"
    ):  # a joined cluster's CPUs are known once it is reached (engines/preflight.py)
        cpus = c.num_cpus or os.cpu_count()
        need, formula = cpus_needed(c, t)
        if need > cpus:
            raise InputError(f"the embedded Ray has {cpus:g} CPUs (cluster.num_cpus) but the job "
                             f"needs {need:g}: {formula}; lower them")


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
                             "evenly over the workers and accumulation steps")


def cpus_needed(c: ClusterSettings, t: TrainSettings) -> tuple[float, str]:
    """Ray CPUs the job needs at its peak, and the formula that gives them: the Spark executors and
    the DDP workers (an elastic group's fewest), at once with ``keep_executors``, else one after the
    other."""
    workers = t.min_workers or t.num_workers
    workers_key = "train.min_workers" if t.min_workers else "train.num_workers"
    spark, train = c.executors * c.executor_ray_cpus, workers * t.cpus_per_worker
    need = spark + train if c.keep_executors else max(spark, train)
    formula = (f"cluster.executors={c.executors} × "
               f"cluster.executor_ray_cpus={c.executor_ray_cpus:g} "
               f"{'+' if c.keep_executors else 'and'} {workers_key}={workers} × "
               f"train.cpus_per_worker={t.cpus_per_worker:g}")
    return need, formula
