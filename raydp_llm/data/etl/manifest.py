"""The ETL's *manifest* stage: what the ETL made (``records.Manifest``, as ``manifest.json`` holds
it), from the scan, the stream's layout, the tokenizer and the curation report."""

from __future__ import annotations

from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data.etl.formats import reader_for
from raydp_llm.data.etl.records import Manifest, Scanned, StreamLayout
from raydp_llm.data.inputs.files import Corpus


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
        table=corpus.table,
    )
