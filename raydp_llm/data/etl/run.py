"""The Spark ETL, from the corpus's lines to chunks of the token stream per train/val split (the
token ids made in the executors). ``run_etl`` is the one place that knows the stages' order; each
stage takes the records it needs (``records.py``) and hands back its own, never calling the next:

1. *read* (``read.py``, a reader per ``data.format`` in ``formats.py``): one row per line with its
   file and the start of its input split (``src``, ``block``), so huge files are split and read in
   parallel; markdown is stripped in the JVM.
2. *scan* (``scan.py``) and the input checks (``checks.py``): per-file lines, characters, NUL bytes
   (binary files), replaced invalid UTF-8, character set; UTF-16, binary and empty corpora refused.
3. *curate* (``curation/curate.py``): quality filters and deduplication, on whole documents.
4. *tokenizer* (``tokenizer.py``): the character set (``char``) or a BPE trained on a sample Spark
   draws (``bpe``).
5. *encode* (``encode.py``): ``mapInArrow`` batches through the tokenizer, a paragraph at a time;
   documents are joined by the end-of-document token; each input split becomes pieces of at most
   ``PIECE_TOKENS`` ids. The driver lays the stream out from the pieces' lengths
   (``chunks.lay_out``) and places each document in it; the contamination check
   (``curation/contamination.py``) follows.
6. *chunk* (``chunks.py``): each piece cuts its own chunks where it lies, and the driver knows the
   chunks' index by arithmetic (windows.py); windows are cut when read (stream.py).
7. *manifest* (``manifest.py``): what the ETL made, for ``manifest.json``.

Everything that touches the corpus runs in Spark executors; the driver collects only per-file
statistics, the tokenizer's training sample (one joined text per batch) and the length and first
``data.halo_tokens`` tokens of each piece of the stream.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession

from raydp_llm.core.config import DataSettings
from raydp_llm.core.timing import timed
from raydp_llm.data.chat import tokens as chat_tokens
from raydp_llm.data.chat.encode import CHAT_COUNTS, chat_counts
from raydp_llm.data.etl.checks import check_scanned
from raydp_llm.data.etl.chunks import cut_chunks, lay_out
from raydp_llm.data.etl.curation import contamination, curate
from raydp_llm.data.etl.encode import Encoding
from raydp_llm.data.etl.formats import reader_for
from raydp_llm.data.etl.manifest import build_manifest
from raydp_llm.data.etl.read import documents, read_lines
from raydp_llm.data.etl.records import Encoded, EtlOutput, EtlPlan, Scanned
from raydp_llm.data.etl.scan import scan_files
from raydp_llm.data.etl.tokenizer import build_tokenizer
from raydp_llm.data.left_out import LeftOut
from raydp_llm.data.preference.encode import PAIR_COUNTS, distinct_prompts
from raydp_llm.data.windows import SPLITS
from raydp_llm.engines.frames import detached


def run_etl(spark: SparkSession, plan: EtlPlan,
            on_phase: Callable[[str, float], None] | None = None) -> EtlOutput:
    """The whole ETL on ``spark``: read (and scan), curate, tokenizer, encode, contamination,
    chunks, manifest. Returns the chunk DataFrames (cut when written or handed to Ray), their index,
    the documents' places and the removed documents, and the manifest. ``on_phase(name,
    seconds)`` is called as each phase before the chunks ends."""
    phases, data = Phases(on_phase), plan.data
    scanned = phases.run("read", lambda: read_and_check(spark, plan))
    document_split = reader_for(data).document_split(data)
    curated = phases.run(
        "curate", lambda: curate.curate(spark, scanned.lines, data, document_split, plan.seed))
    tokenizer = phases.run(
        "tokenizer", lambda: build_tokenizer(curated.lines, scanned.files, plan))
    encoding = Encoding(tokenizer, document_split, data, plan.seed, plan.block_size)
    encoded = _encode(phases, "encode", encoding, curated)
    chat = chat_entry(plan, encoding, encoded) if encoding.chat else None
    if checks_contamination(data):
        encoded = _decontaminate(phases, data, encoding, curated, encoded)
    layout = encoded.layout
    chunks = {name: cut_chunks(encoded.pieces, layout, name) for name in SPLITS}
    manifest = build_manifest(plan.corpus, scanned, layout, tokenizer, document_split,
                              curated.report, chat)
    return EtlOutput(chunks=chunks, index=layout.index, encoded=encoded.pieces,
                     tokenizer=tokenizer, manifest=manifest, phase_s=phases.seconds,
                     documents=encoded.placed, removed=curated.removed,
                     removed_sample=curated.sample())


def phase_names(data: DataSettings) -> list[str]:
    """The phases ``run_etl`` times and reports, in order (the contamination check's when it runs;
    ``encode again`` when it removes documents is not known beforehand)."""
    return ["read", "curate", "tokenizer", "encode"] + (
        ["contamination"] if checks_contamination(data) else [])


def read_and_check(spark: SparkSession, plan: EtlPlan) -> Scanned:
    """The read phase: the lines read, made documents (chat: rendered), scanned and checked; the
    binary files skipped (``data.skip_binary``)."""
    corpus, data = plan.corpus, plan.data
    reader = reader_for(data)
    read = read_lines(spark, corpus, data, plan.s3)
    lines = documents(read, corpus, data, plan.chat_template)
    want_charset = plan.tokenizer.kind == "char" and not reader.token_ids
    files = scan_files(lines, want_charset=want_charset, id_file=reader.token_ids)
    return check_scanned(read, lines, files, plan)


def checks_contamination(data: DataSettings) -> bool:
    """The contamination check runs on text (not on id files, nor on chat, whose rendered
    conversations share the template's text) unless turned off."""
    return (data.decontaminate != "off" and not reader_for(data).token_ids
            and not reader_for(data).chat)


def chat_entry(plan: EtlPlan, encoding: Encoding, encoded: Encoded) -> dict:
    """The manifest's ``chat`` entry: the template (its text, so training can write
    chat_template.jinja beside its checkpoints; its end of turn), the settings, the counts
    (``chat_encode.CHAT_COUNTS``: turns are assistant turns; ``no_assistant``, conversations
    dropped for having none) and the flag bytes each stored token pays."""
    d = plan.data
    flags = chat_tokens.DTYPE.itemsize - encoding.tokenizer.token_dtype.itemsize
    settings = {"train_on": d.train_on, "packing": d.packing}
    counts = chat_counts(encoded.pieces, PAIR_COUNTS if encoding.pairs else CHAT_COUNTS)
    if encoding.pairs:  # each pair two records, only the answers counted, never packed
        settings = {}
        counts["prompts"] = distinct_prompts(encoded.pieces)
        counts |= {f"{side}_tokens_per_pair": counts[f"{side}_tokens"] / max(counts["pairs"], 1)
                   for side in ("chosen", "rejected")}
    entry = {**plan.chat_template.manifest(), **settings, "overlong": d.overlong,
             "record_tokens": plan.block_size + 1, **counts, "flag_bytes_per_token": flags}
    return entry | {"left_out": LeftOut.of(entry).to_json()}


def _encode(phases: Phases, phase: str, encoding: Encoding, curated: curate.Curated) -> Encoded:
    """The curated lines encoded and the stream laid out (timed as ``phase``), and each document's
    place in the stream."""

    def encode_and_lay_out():
        pieces, heads = encoding.run(curated.lines)
        return pieces, lay_out(heads, encoding.data, encoding.seed, encoding.dtype, encoding.record)

    pieces, layout = phases.run(phase, encode_and_lay_out)
    places = contamination.placements(pieces, layout.placed, layout.segments_of)
    return Encoded(pieces, layout, detached(places))


def _decontaminate(phases: Phases, data: DataSettings, encoding: Encoding,
                   curated: curate.Curated, encoded: Encoded) -> Encoded:
    """The contamination check, into the curation report; with ``data.decontaminate=remove``, the
    overlapping training documents dropped and the rest encoded again."""
    found, overlapping = phases.run(
        "contamination", lambda: contamination.check(
            curated.lines, curated.documents, encoded.placed, data.decontaminate_ngram))
    curated.report["contamination"] = found | {"action": data.decontaminate}
    if data.decontaminate != "remove" or not found["train_documents_overlapping"]:
        return encoded
    curated.drop("decontaminate", overlapping, "contamination")
    encoded.unpersist()
    return _encode(phases, "encode again", encoding, curated)


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
