"""The checkpoint component's door: which kind of checkpoint a run writes (full: rank 0 writes the
whole model; sharded: every worker writes its part, with FSDP, and with LoRA the adapters alone),
saving and loading it on the workers, checking one a run resumes from, and exporting the final
one into the run's ``model/``. The only module that chooses among the kinds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from raydp_llm.checkpoint import full, sharded
from raydp_llm.checkpoint.layout import TrainState, is_sharded
from raydp_llm.checkpoint.model_dir import export_model_dir
from raydp_llm.checkpoint.resume import check_resumable
from raydp_llm.core.config import TrainSettings
from raydp_llm.core.model_config import ModelConfig, uses_lora
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.models.base import LanguageModel


@dataclass(frozen=True)
class Checkpointer:
    """How a run's checkpoints are written: ``sharded`` (every worker its part) or full (rank 0)."""

    sharded: bool

    @classmethod
    def for_run(cls, train: TrainSettings, model: ModelConfig) -> Checkpointer:
        """Sharded with FSDP (no worker holds the whole model) and with LoRA (the adapters alone:
        the frozen base is the model the run starts from)."""
        return cls(sharded=train.strategy == "fsdp" or uses_lora(model))

    def writes(self, rank: int) -> bool:
        """Whether the worker of ``rank`` writes (a part of) each checkpoint."""
        return self.sharded or rank == 0

    def save(self, directory: Path, model: LanguageModel, tokenizer: Tokenizer, optimizer,
             state: TrainState) -> Path:
        """A training checkpoint at ``state`` (this worker's part of it when sharded), sealed."""
        save = sharded.save if self.sharded else full.save
        return save(directory, model, tokenizer, optimizer, state)

    def load(self, directory: Path, model: LanguageModel, optimizer) -> TrainState:
        """Weights, optimizer and RNG from a complete checkpoint of this run's kind (one of
        another kind is refused at the door, ``check``); the state it was taken at."""
        load = sharded.load if self.sharded else full.load
        return load(directory, model, optimizer)

    def model_dir_of(self, checkpoint: Path, model: LanguageModel, scratch: Path,
                     cfg: ModelConfig, tokenizer: Tokenizer, rank: int,
                     s3: S3Options = S3Options()) -> Path | None:
        """The model directory that ``checkpoint`` (just written) exports to, on rank 0; None on
        the others. A full checkpoint is one already; a sharded run's live ``model`` is gathered
        into ``scratch`` (every worker calls this at once: the workers' parts of the checkpoint
        lie on their own disks until Ray Train gathers them)."""
        if self.sharded:
            return sharded.gathered(model, scratch, cfg, tokenizer, s3)
        return checkpoint if rank == 0 else None

    def check(self, location: str, model: ModelConfig, shown_as: str,
              s3: S3Options = S3Options()) -> None:
        """``location`` can start this run: one line, named ``shown_as``, when not."""
        check_resumable(location, model, shown_as, s3, sharded=self.sharded)


def export(checkpoint_dir: Path, directory: Path, model: ModelConfig, tokenizer: Tokenizer,
           s3: S3Options = S3Options()) -> Path:
    """The model of a run's final checkpoint into a new, sealed ``directory`` (whole or absent): a
    full checkpoint's model files copied, a sharded one's gathered into the whole model."""
    if is_sharded(checkpoint_dir):
        return sharded.export(checkpoint_dir, directory, model, tokenizer, s3)
    return export_model_dir(checkpoint_dir, directory)
