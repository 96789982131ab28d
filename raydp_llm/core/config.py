"""The configuration's schema: every setting's type, default, meaning and check, and the values a
choice may take (a ``Choice`` Enum each, core/schema.py).

Hydra composes ``conf/*.yaml`` onto these dataclasses (registered by the entry points:
core/registry.py), so a wrong type or an unknown key fails while composing, with Hydra's own error.
The entry points turn the composed config into these typed, frozen objects once
(``OmegaConf.to_object``); from there on the code reads them, never the config. ``validate``
(core/checks.py) then runs each field's check and the checks across settings, before Ray or Spark
start. Each field's ``help`` is printed beside it by ``--help`` and ``--cfg job``
(raydp_llm/cli/help.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from raydp_llm.core.cluster_config import (  # noqa: F401 - the cluster group, re-exported
    ClusterSettings,
    PlacementStrategy,
    is_ip,
)
from raydp_llm.core.data_config import (  # noqa: F401 - the data group, re-exported
    DataFormat,
    DataSettings,
    Decontaminate,
    Dedup,
    DocumentSplit,
    FilterSettings,
    Overlong,
    Shingle,
    SourceSettings,
    TrainOn,
    ValidationSplit,
    WindowSampling,
)
from raydp_llm.core.dpo_config import (  # noqa: F401 - the dpo group, re-exported
    DpoLossKind,
    DpoReference,
    DpoSettings,
)
from raydp_llm.core.grpo_config import GrpoSettings  # noqa: F401 - the grpo group, re-exported
from raydp_llm.core.model_config import (  # noqa: F401 - the model group, re-exported
    MODEL_CONFIGS,
    GPTConfig,
    HFConfig,
    LlamaConfig,
    LSTMConfig,
    ModelConfig,
    model_config,
)
from raydp_llm.core.schema import (
    COUNT,
    OPTIONAL_COUNT,
    POSITIVE,
    Check,
    Choice,
    above,
    at_least,
    one_of,
    optional,
    setting,
    within,
)
from raydp_llm.core.sweep_config import SweepSettings  # noqa: F401 - the sweep group, re-exported

# The defaults that follow other settings (a property beside each reads it): a value the user did
# not give never refuses one the user gave (core/checks.py checks only given values).
DEFAULT_MIN_LR = 1e-4  # optim.min_lr: a tenth of optim.lr, at most this (OptimSettings.end_lr)
DEFAULT_CHECKPOINT_STEPS = 1000  # train.checkpoint_interval: the evaluation nearest this


class TokenizerKind(Choice):
    char = "char"
    bpe = "bpe"


class Precision(Choice):
    auto = "auto", "bf16 on GPU, fp32 on CPU"
    fp32 = "fp32"
    bf16 = "bf16", "ddp: autocast on GPU; fsdp: bf16 compute, fp32 reductions, on any device"


class Strategy(Choice):
    ddp = "ddp", "every worker holds the whole model (DistributedDataParallel)"
    fsdp = "fsdp", "parameters, gradients, AdamW state and checkpoints sharded over the workers"


class TrackingKind(Choice):
    none = "none"
    mlflow = "mlflow"


class Objective(Choice):
    lm = "lm", "next-token cross-entropy (pre-training, continued pre-training, instruction tuning)"
    dpo = "dpo", "direct preference optimisation on data.format=preference pairs (the dpo group)"
    grpo = "grpo", "learning from rewards on data.format=prompts (the grpo group)"


@dataclass(frozen=True)
class CharTokenizerSettings:
    kind: str = setting(TokenizerKind.char, f"{TokenizerKind.listed()} (pick the option "
                        "tokenizer=bpe rather than overriding this)", check=one_of(TokenizerKind))
    path: Optional[str] = setting(None, "an existing tokenizer.json to use instead of building "
                                        "one from the corpus")


@dataclass(frozen=True)
class BPETokenizerSettings(CharTokenizerSettings):
    kind: str = TokenizerKind.bpe.value
    vocab_size: int = setting(4096, "ids, including the end-of-document token <|endoftext|>; at "
                                    "least 257",
                              check=Check(lambda v: v >= 257, "an integer ≥ 257 (256 bytes + the "
                                                              "end-of-document token)"))
    sample_mb: float = setting(32, "MB of text sampled (by Spark, seeded) to train the BPE on",
                               check=POSITIVE)


@dataclass(frozen=True)
class OptimSettings:
    lr: float = setting(1e-3, "peak learning rate, > 0", check=POSITIVE)
    min_lr: Optional[float] = setting(None, "learning rate at the end of the cosine decay, in "
                                            "[0, lr]; null = lr / 10, at most 1e-4",
                                      check=optional(at_least(0)))
    warmup_steps: int = setting(100, "optimizer steps of linear warmup", check=at_least(0))
    weight_decay: float = setting(0.1, "AdamW weight decay, applied to weight matrices only",
                                  check=at_least(0))
    beta1: float = setting(0.9, "AdamW beta1, in [0, 1)", check=within(0, 1))
    beta2: float = setting(0.99, "AdamW beta2, in [0, 1)", check=within(0, 1))
    grad_clip: float = setting(1.0, "max gradient norm; 0 = no clipping", check=at_least(0))

    @property
    def end_lr(self) -> float:
        """The learning rate the decay ends at: ``min_lr`` when given, else a tenth of ``lr`` and at
        most ``DEFAULT_MIN_LR`` (so any ``lr`` runs, and every ``lr`` ≥ 1e-3 ends at 1e-4)."""
        return self.min_lr if self.min_lr is not None else min(DEFAULT_MIN_LR, self.lr / 10)


@dataclass(frozen=True)
class TrainSettings:
    num_workers: int = setting(2, "DDP workers (Ray Train actors); with min_workers, the most",
                               check=COUNT)
    min_workers: Optional[int] = setting(None, "elastic training: the fewest DDP workers to train "
                                               "with (Ray Train starts as many as fit, up to "
                                               "num_workers, and grows the group as nodes come "
                                               "back); null = exactly num_workers",
                                         check=OPTIONAL_COUNT)
    max_failures: int = setting(3, "lost workers (a crash, a lost node) a run survives: Ray Train "
                                   "restarts the worker group from the last checkpoint; 0 = fail "
                                   "at the first",
                                check=Check(lambda v: v >= -1, "-1 (no limit) or a number ≥ 0"))
    cpus_per_worker: int = setting(1, "Ray CPUs per worker; also its torch thread count",
                                   check=POSITIVE)
    use_gpu: bool = setting(False, "one GPU per worker")
    batch_size: int = setting(12, "windows per optimizer step, over all workers and accumulation "
                                  "steps", check=COUNT)
    grad_accum: int = setting(1, "micro-batches accumulated per optimizer step "
                                 "(batch_size divisible by num_workers × grad_accum)", check=COUNT)
    max_steps: int = setting(3000, "optimizer steps (ignored when epochs is set)", check=COUNT)
    epochs: Optional[int] = setting(None, "passes over the training windows; null = train for "
                                          "max_steps", check=OPTIONAL_COUNT)
    eval_interval: int = setting(250, "steps between evaluations (a metrics.csv row each)",
                                 check=COUNT)
    eval_batches: Optional[int] = setting(50, "validation micro-batches per worker per evaluation "
                                              "(grpo: eval_batches × batch_size held-out "
                                              "prompts); null = the whole validation split",
                                          check=OPTIONAL_COUNT)
    checkpoint_interval: Optional[int] = setting(
        None, "steps between checkpoints, a multiple of eval_interval; 0 = only the final one; "
              "null = the evaluation nearest 1000 steps (the multiple of eval_interval nearest "
              "1000, the smaller on a tie, at least eval_interval)",
        check=optional(at_least(0)))
    keep_checkpoints: int = setting(2, "checkpoints kept per run (the latest ones; with best_by, "
                                       "the best ones by it and the latest)", check=COUNT)
    best_by: Optional[str] = setting(None, "a metrics.csv column (val_loss, val_acc, "
                                           "val_loss_<source>, task_<task>_<metric>) that ranks "
                                           "the checkpoints: the best is kept, exported to "
                                           "best_model/ and reported in summary.json; losses, "
                                           "perplexities and bits lower, the others higher")
    eval_tasks: List[str] = setting([], "lm-evaluation-harness tasks (names, or paths of task "
                                        "YAMLs) scored on the model at checkpoints, offline: "
                                        "metrics.csv columns task_<task>_<metric>")
    task_interval: Optional[int] = setting(None, "steps between task scorings, a multiple of the "
                                                 "checkpoint interval; null = at every "
                                                 "checkpoint", check=OPTIONAL_COUNT)
    task_limit: Optional[float] = setting(None, "documents per task at each scoring (below 1: "
                                                "a fraction); null = all",
                                          check=optional(above(0)))
    resume: str = setting("auto", "auto = continue the latest unfinished checkpoint of an "
                                  "identical run | never | a checkpoint dir (local or s3://)")
    storage_path: Optional[str] = setting(None, "where Ray Train writes checkpoints, and the "
                                                "run's outputs are copied when it ends "
                                                "(<storage_path>/<run>/): a directory or "
                                                "s3://bucket/prefix; null = ray_results/ in the "
                                                "run directory")
    strategy: str = setting(Strategy.ddp, Strategy.listed(), check=one_of(Strategy))
    objective: str = setting(Objective.lm, Objective.listed(), check=one_of(Objective))
    precision: str = setting(Precision.auto, Precision.listed(), check=one_of(Precision))
    activation_checkpointing: bool = setting(
        False, "recompute each block's activations in the backward pass: less memory, ~1/3 more "
               "compute")
    compile: bool = setting(False, "torch.compile the model (worth it on GPUs)")
    peak_flops: Optional[float] = setting(None, "one worker's peak FLOP/s for MFU (e.g. 989e12 "
                                                "for an H100's bf16); null = no MFU",
                                          check=optional(POSITIVE))

    @property
    def checkpoint_every(self) -> int:
        """Steps between checkpoints (0: only the final one): ``checkpoint_interval`` when given,
        else the evaluation nearest ``DEFAULT_CHECKPOINT_STEPS`` steps (``nearest_multiple``)."""
        if self.checkpoint_interval is not None:
            return self.checkpoint_interval
        return nearest_multiple(self.eval_interval, DEFAULT_CHECKPOINT_STEPS)


def nearest_multiple(step: int, target: int) -> int:
    """The multiple of ``step`` nearest ``target``, the smaller one on a tie, and at least ``step``
    (``nearest_multiple(60, 1000)`` = 1020, ``nearest_multiple(400, 1000)`` = 800)."""
    below, rest = divmod(target, step)
    return step * max(1, below + int(2 * rest > step))


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: Optional[str] = setting(
        None, "an S3-compatible service instead of AWS, e.g. http://127.0.0.1:9000 (MinIO); null = "
              "AWS",
        check=optional(Check(lambda v: v.startswith(("http://", "https://")),
                             "an http:// or https:// URL")))
    region: Optional[str] = setting(None, "the buckets' AWS region; null = from AWS_REGION, "
                                          "~/.aws/config or the instance")
    max_attempts: int = setting(10, "attempts per S3 request (exponential backoff from 25 ms) "
                                    "before it fails: S3 answers SlowDown or 5xx under load",
                                check=COUNT)


@dataclass(frozen=True)
class SampleSettings:
    prompt: str = setting("\n", "text the sample continues")
    max_new_tokens: int = setting(600, "tokens to generate", check=at_least(0))
    temperature: float = setting(0.8, "softmax temperature; 0 = greedy", check=at_least(0))
    top_k: Optional[int] = setting(50, "sample among the k most likely tokens; null = all",
                                   check=OPTIONAL_COUNT)


@dataclass(frozen=True)
class TrackingSettings:
    kind: str = setting(TrackingKind.none, f"{TrackingKind.listed()} (pick the option "
                        "tracking=mlflow rather than overriding this)", check=one_of(TrackingKind))
    uri: Optional[str] = setting(None, "mlflow: the tracking server (http://host:5000) or store "
                                       "URI; null = a local store, outputs/mlflow.db (nothing to "
                                       "start; browse it with `mlflow ui --backend-store-uri "
                                       "sqlite:///outputs/mlflow.db`)")
    experiment: str = setting("raydp_llm", "mlflow: the experiment the runs are logged under")
    log_model: bool = setting(True, "mlflow: log model/ among the artifacts (false: metrics, "
                                    "plots and the JSON files only)")


@dataclass(frozen=True)
class Settings:
    name: str = setting("raydp_llm", "run name: the Spark app, the Ray Train run and the output "
                                     "folder carry it")
    required: List[str] = setting([], "settings this configuration cannot run without, each "
                                      "to be given, e.g. [data.path] for a corpus not shipped")
    seed: int = setting(1337, "seeds model init, data order, window shuffle and sampling")
    data: DataSettings = setting(DataSettings(), "the corpus and how the ETL cuts it into "
                                                 "training windows")
    tokenizer: Any = setting(MISSING, f"{TokenizerKind.listed()}: how text becomes token ids")
    model: Any = setting(MISSING, "the language model: gpt | gpt_nano | gpt_tiny | gpt_mini | "
                                  "gpt2_small | lstm | llama | llama_wide (transformers' Llama) | "
                                  "hf | hf_lora (a Hugging Face directory: model.path)")
    optim: OptimSettings = setting(OptimSettings(), "AdamW with linear warmup and cosine decay")
    train: TrainSettings = setting(TrainSettings(), "Ray Train: DDP workers, batches, steps, "
                                                    "evaluation, checkpoints")
    dpo: DpoSettings = setting(DpoSettings(), "preference tuning (train.objective=dpo): the "
                                              "loss and the reference model")
    grpo: GrpoSettings = setting(GrpoSettings(), "learning from rewards (train.objective=grpo)")
    cluster: ClusterSettings = setting(ClusterSettings(), "Ray, and Spark on it with RayDP")
    sample: SampleSettings = setting(SampleSettings(), "text generated into samples.txt after "
                                                       "training")
    s3: S3Settings = setting(S3Settings(), "S3 access for s3:// data, storage, checkpoints; "
                                           "credentials: the AWS chain (env, ~/.aws, role)")
    tracking: TrackingSettings = setting(MISSING, "experiment tracking: "
                                         f"{TrackingKind.listed()} (settings, metrics, outputs)")
    sweep: SweepSettings = setting(SweepSettings(), "-m: trials at once and early stopping")


def source_settings(settings: Settings, source: SourceSettings) -> Settings:
    """The settings of one source of a mixture (``data.sources``): ``data.*`` with the source's
    place and reading, as a run on that source alone would have them (its ETL, its cache key,
    its windows)."""
    data = settings.data
    return replace(settings, data=replace(
        data, sources=[], path=source.path, query=source.query, table=source.table,
        table_version=source.table_version, table_since=source.table_since,
        format=source.format or data.format, text_column=source.text_column or data.text_column))


@dataclass(frozen=True)
class PromptTable:
    """``generate``'s batch answers: a table of prompts, an answer per row (``out``)."""

    path: Optional[str] = setting(None, "Parquet or JSON Lines files of prompts (a file, a "
                                        "directory read recursively, a glob, or s3://), a "
                                        "prompt per row; null = the one prompt")
    query: Optional[str] = setting(None, "a Spark SQL query whose rows are the prompts (over "
                                         "the catalog, or files: parquet.`/path`), instead of "
                                         "data.path")
    format: str = setting("parquet", "parquet | jsonl",
                          check=Check(lambda v: v in ("parquet", "jsonl"), "parquet | jsonl"))
    text_column: str = setting("prompt", "the column holding each row's prompt")
    messages_column: Optional[str] = setting(None, "the column holding each row's conversation "
                                                   "(a list of {role, content}) instead: "
                                                   "rendered with the model's chat template and "
                                                   "its generation prompt, answered with the "
                                                   "next assistant turn")


@dataclass(frozen=True)
class TableOutput:
    """Where a job's rows are also appended, each once (data/inputs/table_out.py,
    docs/tables.md)."""

    table: Optional[str] = setting(None, "a Delta table (a directory, created when missing) or, "
                                         "with output.catalog, an Iceberg namespace.table; "
                                         "null = none")
    catalog: Dict[str, Any] = setting({}, "output.table's Iceberg catalog, as data.catalog "
                                          "(generate: JSON); {} = a Delta table")


@dataclass(frozen=True)
class GenerateSettings(SampleSettings):
    """``python -m raydp_llm.generate``: the sample settings, and what the command needs beside
    them."""

    max_new_tokens: int = 600
    model_dir: Optional[str] = setting(None, "the model/ directory of a finished run, or its "
                                             "s3:// URI (required)")
    seed: int = setting(1337, "seeds the sampling: the same seed gives the same text")
    show_top: int = setting(0, "also print the N likeliest tokens right after the prompt, with "
                               "their probabilities")
    chat: bool = setting(False, "the prompt is a user turn: rendered with the model's chat "
                                "template and its generation prompt; the reply stops at the end "
                                "of the turn")
    s3: S3Settings = setting(S3Settings(), "S3 access for an s3:// model_dir, data.path or out")
    data: PromptTable = setting(PromptTable(), "batch answers: the prompts")
    out: Optional[str] = setting(None, "batch answers: the directory (or s3:// prefix) of the "
                                       "Parquet parts (the input's columns, completion, "
                                       "completion_tokens, mean_logprob); a rerun continues it")
    output: TableOutput = setting(TableOutput(), "batch answers: also every answer, once, into "
                                                 "a table, each row with the job's id and the "
                                                 "table snapshot its model learned from")
    rows_per_part: int = setting(64, "batch answers: rows per Parquet part, the unit a rerun "
                                     "skips when written", check=COUNT)
    actors: Optional[int] = setting(None, "batch answers: Ray actors, each holding the model "
                                          "once; null = one per CPU", check=OPTIONAL_COUNT)


@dataclass(frozen=True)
class ExportSettings:
    """``python -m raydp_llm.export``: a model directory to Hugging Face's GPT-2 format."""

    model_dir: Optional[str] = setting(None, "the model/ directory of a finished run (a GPT), or "
                                             "its s3:// URI (required)")
    out: Optional[str] = setting(None, "the directory to write: new, or empty (required)")
    s3: S3Settings = setting(S3Settings(), "S3 access for an s3:// model_dir")


@dataclass(frozen=True)
class EvaluateSettings(Settings):
    name: str = "evaluate"
    model_dir: Optional[str] = setting(None, "the model/ directory of a finished run (required)")
    ref_model_dir: Optional[str] = setting(None, "data.format=preference: the model the DPO "
                                                 "rewards are measured against; null = the "
                                                 "reference model_dir records (preference.json)")
    eval_batch_size: int = setting(32, "windows per forward pass (tasks: the harness's batch "
                                       "size)")
    tasks: List[str] = setting([], "lm-evaluation-harness tasks instead of a corpus: harness "
                                   "task names, or paths of task YAMLs (dataset_path json or "
                                   "parquet, local data_files); offline")
    num_fewshot: Optional[int] = setting(None, "tasks: examples in each prompt; null = each "
                                               "task's own", check=optional(at_least(0)))
    limit: Optional[float] = setting(None, "tasks: at most this many documents per task (below "
                                           "1: a fraction); null = all",
                                     check=optional(above(0)))
    output: TableOutput = setting(TableOutput(), "also the scores into a table: a row per "
                                                 "figure, with the model's and the data's table "
                                                 "snapshots")
    per_document: bool = setting(False, "also score every document on the cluster (Ray Data, an "
                                        "actor per CPU) into document_scores.parquet: path, "
                                        "doc, val, tokens, mean_loss; a later ETL filters with "
                                        "it (data.filters.score_path)")
