"""What the ETL is asked to build (``EtlPlan``), what it hands back (``EtlOutput``), and its phases'
clock (``Phases``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from raydp_llm.core.config import DataSettings, Settings
from raydp_llm.core.storage import S3Options
from raydp_llm.core.timing import timed
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data.chat import ChatTemplate, resolve_template
from raydp_llm.data.corpus import Corpus
from raydp_llm.data.etl.formats import reader_for
from raydp_llm.data.stream import ChunkIndex

if TYPE_CHECKING:
    from raydp_llm.data.etl.manifest import Manifest


@dataclass(frozen=True)
class EtlPlan:
    """What the ETL builds: the token stream of ``corpus`` in chunks, read and split as ``data``
    says, tokenized with ``tokenizer`` (settings, or a ``SavedTokenizer``), split with ``seed``;
    ``s3`` reaches ``s3://`` inputs. No window setting: windows are cut when read, but for chat
    (``data.format=chat``), whose records are ``block_size + 1`` tokens; ``model_path``: the model
    whose chat template renders the conversations (else the tokenizer's directory, else chatml)."""

    corpus: Corpus
    data: DataSettings
    tokenizer: object
    seed: int
    s3: S3Options = S3Options()
    block_size: int | None = None
    model_path: str | None = None

    def chat_template(self) -> ChatTemplate | None:
        """The chat template (``data.format=chat``), or None."""
        if not reader_for(self.data).chat:
            return None
        at = self.model_path or getattr(self.tokenizer, "path", None)
        if at and Path(at).is_file():  # a tokenizer.json: its model directory keeps the template
            at = str(Path(at).parent)
        model_dir = at if at and Path(at).is_dir() else None
        return resolve_template(self.data.chat_template, model_dir)

    @classmethod
    def of(cls, settings: Settings, corpus: Corpus, tokenizer: object = None) -> EtlPlan:
        """The plan a run's settings make (``tokenizer`` instead of ``settings.tokenizer``)."""
        return cls(corpus, settings.data, tokenizer or settings.tokenizer, settings.seed,
                   S3Options.of(settings.s3), getattr(settings.model, "block_size", None),
                   getattr(settings.model, "path", None))


@dataclass
class EtlOutput:
    chunks: dict[str, DataFrame]  # per split: CHUNK_SCHEMA rows, tokens as raw `token_dtype` bytes
    index: dict[str, ChunkIndex]  # per split: the chunks, by arithmetic
    encoded: DataFrame  # the cached token stream the chunks are cut from
    tokenizer: Tokenizer
    manifest: Manifest  # manifest.json (Manifest.to_json)
    phase_s: dict = field(default_factory=dict)
    documents: DataFrame | None = None  # src, doc, start, end, tokens, val: each document's place
    removed: DataFrame | None = None  # src, doc, bytes, reason, kept_src, kept_doc
    removed_sample: list[dict] = field(default_factory=list)  # a few removed documents per reason


class Phases:
    """Each phase's wall time into ``seconds``, and ``on_phase(name, seconds)`` told as it ends."""

    def __init__(self, on_phase: Callable[[str, float], None] | None):
        self.on_phase, self.seconds = on_phase, {}

    def run(self, name: str, work: Callable):
        with timed(self.seconds, name):
            result = work()
        if self.on_phase:
            self.on_phase(name, self.seconds[name])
        return result
