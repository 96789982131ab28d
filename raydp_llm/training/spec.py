"""What the DDP workers train: the typed settings as the user gave them, the model's with its
vocabulary size, and what the ETL made. Built once on the driver, frozen, and handed to every worker
unchanged."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

from raydp_llm.core.config import (
    DpoSettings,
    GrpoSettings,
    ModelConfig,
    OptimSettings,
    Settings,
    TrainSettings,
)
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import Tokenizer, tokenizer_from_json
from raydp_llm.data.etl.records import Manifest
from raydp_llm.data.mixture import MixtureSpec
from raydp_llm.data.stream import ChunkIndex, RunWindows, Sampling, steps_per_epoch
from raydp_llm.models.embeddings import read_embeddings

# Settings that change how a run is watched, how fast it goes or where it runs, not what it trains:
# a run may continue another's checkpoints with other values (and with another number of workers).
NOT_IN_FINGERPRINT = (
    "num_workers",
    "min_workers",
    "max_failures",
    "cpus_per_worker",
    "use_gpu",
    "compile",
    "activation_checkpointing",
    "peak_flops",
    "eval_interval",
    "eval_batches",
    "checkpoint_interval",
    "keep_checkpoints",
    "best_by",
    "eval_tasks",
    "task_interval",
    "task_limit",
    "resume",
    "storage_path",
)


@dataclass(frozen=True)
class TrainSpec:
    """Everything a worker needs, as plain values (workers do not see Hydra); the same for any
    number of workers."""

    model: ModelConfig  # vocab_size set
    optim: OptimSettings
    train: TrainSettings
    seed: int
    tokenizer_json: str
    token_dtype: str
    chars_per_token: float | None  # for bits per character; None for pre-tokenized ids
    sampling: dict[str, Sampling]  # how each split's windows are cut from its chunks
    steps_per_epoch: int
    max_steps: int
    fingerprint: str  # identifies runs that may resume each other's checkpoints
    s3: S3Options = S3Options()  # how to reach s3:// paths
    # chat data (data.format=chat): its template, saved beside the model; the windows' tokens
    # carry the loss mask and the conversations' starts (data/chat/tokens.py)
    chat_template: str | None = None
    dpo: DpoSettings = DpoSettings()  # train.objective=dpo: the loss and its reference
    # data.sources: the sources, their weights and windows; the run is one epoch of max_steps
    # steps, each source counting its own (data/mixture.py)
    mixture: MixtureSpec | None = None
    grpo: GrpoSettings = GrpoSettings()  # train.objective=grpo: answers, rewards, the loss
    answer_end: str | None = None  # grpo: the chat template's end of turn (an answer's end)

    @property
    def pairs(self) -> bool:
        """Whether each window is a preference pair (two records: data/batches.py)."""
        return self.train.objective == "dpo"

    @property
    def without_dropout(self) -> bool:
        """Whether the policy trains with dropout off: DPO's and GRPO's, unless their
        ``disable_dropout`` is false (the policy at its first step is then exactly the
        reference, and the ratios of GRPO's first update are 1)."""
        objective = self.train.objective
        return ((objective == "dpo" and self.dpo.disable_dropout)
                or (objective == "grpo" and self.grpo.disable_dropout))

    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer, with the chat template its saved models carry."""
        tokenizer = tokenizer_from_json(self.tokenizer_json)
        tokenizer.chat_template = self.chat_template
        return tokenizer

    def micro_batch(self, world: int) -> int:
        """Windows per forward pass on each of ``world`` workers."""
        return self.train.batch_size // (world * self.train.grad_accum)


def build_spec(settings: Settings, tokenizer: Tokenizer, manifest: Manifest,
               windows: RunWindows, sampling: dict[str, Sampling],
               mixture: MixtureSpec | None = None) -> TrainSpec:
    """The spec of a run on the ETL's output (its ``tokenizer`` and ``manifest``; a mixture's
    sources: ``mixture``) and the run's ``windows`` on it, cut as ``sampling`` says. One line when
    the corpus holds fewer windows than a batch, or ``model.init_embeddings`` holds ids the
    vocabulary lacks (checked here, on the driver: in the workers Ray Train would retry the
    error)."""
    train = settings.train
    per_epoch = steps_per_epoch(windows.train, train.batch_size)
    if mixture is not None:  # one pass of the run's steps; each source counts its own epochs
        per_epoch = train.max_steps
    if per_epoch == 0:
        raise InputError(f"train.batch_size={train.batch_size}: the corpus has only "
                         f"{windows.train} training windows, fewer than one batch; "
                         "lower train.batch_size or use a larger corpus")
    # model=hf keeps its embedding's rows (cli/inputs.py checked the tokenizer's ids fit them)
    model = replace(settings.model, vocab_size=settings.model.vocab_size or tokenizer.vocab_size)
    if getattr(model, "init_embeddings", None):
        read_embeddings(model.init_embeddings, model.vocab_size, model.n_embd)
    max_steps = train.epochs * per_epoch if train.epochs else train.max_steps
    spec = TrainSpec(model=model, optim=settings.optim, train=train, seed=settings.seed,
                     tokenizer_json=tokenizer.to_json(), token_dtype=manifest.token_dtype,
                     chars_per_token=manifest.chars_per_token, sampling=sampling,
                     steps_per_epoch=per_epoch,
                     max_steps=max_steps, fingerprint="", s3=S3Options.of(settings.s3),
                     chat_template=(manifest.chat or {}).get("template_text"),
                     dpo=settings.dpo, mixture=mixture)
    return replace(spec, fingerprint=fingerprint(spec, manifest.to_json() | windows.to_json()))


def build_prompt_spec(settings: Settings, data) -> TrainSpec:
    """The spec of a run that learns from rewards on ``data`` (``prompts.dataset.PromptData``): an
    epoch is every training prompt once, ``train.batch_size`` a step."""
    train, tokenizer = settings.train, data.tokenizer
    per_epoch = data.sources["train"].count // train.batch_size
    model = replace(settings.model, vocab_size=settings.model.vocab_size or tokenizer.vocab_size)
    template = data.template
    spec = TrainSpec(model=model, optim=settings.optim, train=train, seed=settings.seed,
                     tokenizer_json=tokenizer.to_json(), token_dtype="int32",
                     chars_per_token=None, sampling={}, steps_per_epoch=per_epoch,
                     max_steps=train.epochs * per_epoch if train.epochs else train.max_steps,
                     fingerprint="", s3=S3Options.of(settings.s3),
                     chat_template=template.text if template else None, grpo=settings.grpo,
                     answer_end=template.end_of_turn() if template else None)
    return replace(spec, fingerprint=fingerprint(spec, data.manifest_json()))


def fingerprint(spec: TrainSpec, data: dict) -> str:
    """Runs that may continue each other's checkpoints: the same training on the same data (the
    run's ``manifest.json``)."""
    identity = asdict(spec) | {"data": data, "fingerprint": None, "s3": None}
    identity["train"] = {k: v for k, v in identity["train"].items() if k not in NOT_IN_FINGERPRINT}
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# How the run cuts its windows from the ETL's chunks


def samplings(settings: Settings) -> dict[str, Sampling]:
    """How a run cuts each split's windows: training as ``data.sampling`` and ``data.stride`` say,
    validation always every ``data.val_stride`` tokens. Chat: each window is a record (stride
    ``block_size + 1``), in both splits (random offsets are refused: ``core/checks.py``)."""
    block, d = settings.model.block_size, settings.data
    if d.pairs:  # a window is a pair: two records
        return {name: Sampling(2 * block + 1, 2 * (block + 1)) for name in ("train", "val")}
    if d.chat:
        return {name: Sampling(block, block + 1) for name in ("train", "val")}
    return {"train": Sampling(block, d.stride or block, random=d.sampling == "random"),
            "val": Sampling(block, d.val_stride or block)}


def scoring_samplings(settings: Settings) -> dict[str, Sampling]:
    """How ``evaluate`` cuts both splits so that every token is predicted once: a stride of one
    block (random offsets too), each segment's last, shorter window included (a chat or pair
    stream's windows are whole records already)."""
    return {name: replace(cut, random=False, partial=not settings.data.chat)
            for name, cut in samplings(settings).items()}


def windows_of(settings: Settings, index: dict[str, ChunkIndex], manifest: Manifest,
               every_token: bool = False) -> RunWindows:
    """The run's windows on the ETL's chunks (``index``, ``manifest``): how they are cut and how
    many each split has per epoch (``every_token``: evaluation's, ``scoring_samplings``). One line
    when a split has none (a corpus too small for the block; evaluation: when both have none)."""
    cut = scoring_samplings(settings) if every_token else samplings(settings)
    counts = {name: cut[name].windows(index[name]) for name in cut}
    enough = (counts["train"] or counts["val"]) if every_token else \
        (counts["train"] and counts["val"])
    if not enough:
        b, d = settings.model.block_size, settings.data
        needed = -(-(b + 1) // min(d.val_fraction, 1 - d.val_fraction))
        raise InputError(f"data.path: the corpus {manifest.corpus} has "
                         f"{manifest.tokens} tokens, giving {counts['train']} training "
                         f"and {counts['val']} validation windows of {b + 1} tokens; at least "
                         f"{int(needed)} tokens are needed: use a larger corpus or a smaller "
                         "model.block_size")
    return RunWindows(cut["train"].block_size, settings.data.sampling, cut["train"].stride,
                      cut["val"].stride, counts["train"], counts["val"])
