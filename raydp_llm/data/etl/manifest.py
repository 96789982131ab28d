"""What the ETL made, as ``manifest.json`` holds it: the inputs, the text, the tokens, the chunks,
the settings. The JSON's keys are the fields, in this order (``to_json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data.corpus import Corpus
from raydp_llm.data.etl.checks import Scanned
from raydp_llm.data.etl.chunks import StreamLayout
from raydp_llm.data.etl.formats import reader_for


@dataclass
class Manifest:
    corpus: str  # its name
    files: int  # read (the binary files skipped left out)
    skipped_binary_files: list[str]
    documents: int
    bytes: int | None  # of the files read; None when a file's size is unknown (hdfs://), queries
    characters: int  # newlines included
    invalid_utf8_replaced: int
    tokens: int
    tokens_train: int
    tokens_val: int
    chars_per_token: float | None  # None for id files
    chunks_train: int
    chunks_val: int
    chunk_tokens: int
    halo_tokens: int
    token_bytes_stored: int  # the chunks' tokens, halos included
    vocab_size: int
    tokenizer: str  # its kind
    tokenizer_hash: str
    token_dtype: str
    split: str  # data.split: tail or hash
    val_fraction: float
    format: str
    seed: int
    inputs: list[dict]  # the corpus' fingerprints: path, size, mtime_ns per file
    document_split: str  # as the encoder cut documents (line for Parquet and JSON Lines)
    curation: dict  # what curation removed and found, stage by stage
    etl_key: str | None = None  # the ETL cache key (prepare.py): the inputs and settings read
    bad_json_lines: dict | None = None  # JSON Lines: by kind and per file; first in the JSON
    chat: dict | None = None  # data.format=chat: template, settings, counts; before etl_key

    def to_json(self) -> dict:
        """The manifest as ``manifest.json`` holds it: keys in field order, the optional ones
        (``bad_json_lines`` first, ``chat`` then ``etl_key`` last) only when set."""
        fields = asdict(self)
        bad_json_lines, etl_key = fields.pop("bad_json_lines"), fields.pop("etl_key")
        chat = fields.pop("chat")
        head = {} if bad_json_lines is None else {"bad_json_lines": bad_json_lines}
        tail = {} if chat is None else {"chat": chat}
        tail |= {} if etl_key is None else {"etl_key": etl_key}
        return head | fields | tail

    @classmethod
    def from_json(cls, content: dict) -> Manifest:
        return cls(**content)

    def chunks(self, split: str) -> int:
        """The chunks of ``split`` (train or val)."""
        return {"train": self.chunks_train, "val": self.chunks_val}[split]


def build_manifest(corpus: Corpus, scanned: Scanned, layout: StreamLayout, tokenizer: Tokenizer,
                   document_split: str, curation: dict, chat: dict | None = None) -> Manifest:
    """The manifest of a finished ETL (all but ``etl_key``, which the ETL's caller knows); the
    stored tokens are the layout's (chat: flagged words)."""
    n, d, files = layout.n_tokens, layout.data, scanned.files
    tokens_val = layout.index["val"].tokens()
    characters = sum(f.chars for f in files.values())
    return Manifest(
        **reader_for(d).manifest_facts(files),
        corpus=corpus.name,
        files=len(files),
        skipped_binary_files=scanned.skipped,
        documents=sum(p.docs for p in layout.pieces),
        # a query's input files are not what it reads (corpus.files: none)
        bytes=sum(corpus.size_of(src) or 0 for src in files) if corpus.sizes and corpus.files
        else None,
        characters=characters,
        invalid_utf8_replaced=sum(f.replaced for f in files.values()),
        tokens=n,
        tokens_train=n - tokens_val,
        tokens_val=tokens_val,
        chars_per_token=characters / max(n, 1) if tokenizer.kind != "ids" else None,
        chunks_train=len(layout.index["train"]),
        chunks_val=len(layout.index["val"]),
        chunk_tokens=d.chunk_tokens,
        halo_tokens=d.halo_tokens,
        token_bytes_stored=layout.stored_tokens() * layout.dtype.itemsize,
        vocab_size=tokenizer.vocab_size,
        tokenizer=tokenizer.kind,
        tokenizer_hash=tokenizer.fingerprint,
        token_dtype=layout.dtype.name,
        split=d.split,
        val_fraction=d.val_fraction,
        format=d.format,
        seed=layout.seed,
        inputs=corpus.fingerprints,
        document_split=document_split,
        curation=curation,
        chat=chat,
    )
