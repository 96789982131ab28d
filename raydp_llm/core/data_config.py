"""The data group's schema (conf/data/): where the corpus is and how it is read, split, cleaned,
deduplicated and cut into windows (``DataSettings``, with its quality filters ``FilterSettings``),
and the values its choices may take. Apart from the rest of the configuration (core/config.py,
which re-exports it), as the model group is (core/model_config.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from raydp_llm.core.schema import (
    COUNT,
    FRACTION,
    OPTIONAL_COUNT,
    POSITIVE,
    Check,
    Choice,
    above,
    at_least,
    one_of,
    optional,
    setting,
)


class DocumentSplit(Choice):
    file = "file"
    blank_line = "blank_line"
    line = "line"


class WindowSampling(Choice):
    stride = "stride", "every data.stride tokens"
    random = "random", ("seeded random offsets, nanoGPT's sampling; as many per epoch as a stride "
                        "of model.block_size gives")


class ValidationSplit(Choice):
    tail = "tail", "the last val_fraction of the token stream is validation, as in nanoGPT"
    hash = "hash", "seeded chunks"


class DataFormat(Choice):
    text = "text"
    ids = "ids", "lines of whitespace-separated integer token ids"
    parquet = "parquet", "a text column"
    jsonl = "jsonl", "JSON Lines: an object per line"
    chat = "chat", ("conversations, a JSON Lines or Parquet row each (or data.query's rows), "
                    "rendered with a chat template; docs/instruction-tuning.md")
    sql = "sql", "the rows of data.query, a Spark SQL query: data.text_column is a document"
    preference = "preference", ("pairs of answers to a prompt, the chosen and the rejected, a "
                                "JSON Lines or Parquet row each (or data.query's rows), rendered "
                                "with a chat template; train.objective=dpo; "
                                "docs/preference-tuning.md")
    prompts = "prompts", ("prompts to answer, a JSON Lines or Parquet row each (or data.query's "
                          "rows): data.prompt_column or data.messages_column, the other columns "
                          "for the rewards; train.objective=grpo; docs/rl.md")


class TrainOn(Choice):
    assistant = "assistant", "every assistant turn"
    all = "all", "every token of the conversation"
    last = "last", "the last assistant turn only"


class Overlong(Choice):
    drop = "drop", "leave it out (counted)"
    truncate = "truncate", "keep its first model.block_size + 1 tokens (counted)"
    error = "error", "stop the ETL, naming it"


class Dedup(Choice):
    none = "none"
    exact = "exact", "documents equal after normalizing: kept once"
    near = "near", "MinHash LSH: one of each cluster of near duplicates"


class Shingle(Choice):
    word = "word"
    char = "char"


class Decontaminate(Choice):
    report = "report", "count validation documents sharing an n-gram with training documents"
    remove = "remove", "and drop those training documents"
    off = "off", ("it costs about 5 s on a small corpus, 0.7-1.2x the rest of the ETL at 25-100 MB "
                  "on 2 cores")


@dataclass(frozen=True)
class FilterSettings:
    """Quality filters on whole documents, each off while null; a document failing any is dropped
    before deduplication. The Gopher rules (Rae et al. 2021, appendix A.1.1) with the thresholds
    that paper used in each help; docs/data-curation.md has the origin of each."""

    min_words: Optional[int] = setting(None, "drop documents of fewer words (Gopher: 50)",
                                       check=optional(at_least(0)))
    max_words: Optional[int] = setting(None, "drop documents of more words (Gopher: 100000)",
                                       check=OPTIONAL_COUNT)
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
    max_score_quantile: Optional[float] = setting(
        None, "drop scored documents above this quantile of the mean loss, in (0, 1]",
        check=optional(Check(lambda v: 0 < v <= 1, "a quantile in (0, 1]")))


@dataclass(frozen=True)
class SourceSettings:
    """One source of a mixture (``data.sources``): its name, its weight, and where its documents
    are and how they are read (null: as ``data.*`` says); every other ``data.*`` setting applies
    to each source alike. docs/continued-pretraining.md."""

    name: str = setting("", "its name, in letters, digits and _: its validation loss is "
                            "val_loss_<name>", check=Check(lambda v: v.isidentifier(),
                                                           "a name of letters, digits and _"))
    weight: float = setting(1.0, "its share of the training tokens (the weights are normalized "
                                 "to sum to 1)", check=POSITIVE)
    path: Any = setting(None, "as data.path (or query, or table)")
    query: Optional[str] = setting(None, "as data.query")
    table: Optional[str] = setting(None, "as data.table (its catalog: data.catalog)")
    table_version: Optional[int] = setting(None, "as data.table_version",
                                           check=optional(at_least(0)))
    table_since: Optional[str] = setting(None, "as data.table_since: a source of the rows "
                                               "appended since, beside one that replays the "
                                               "snapshot before")
    format: Optional[str] = setting(None, "as data.format; null = data.format",
                                    check=optional(one_of(DataFormat)))
    text_column: Optional[str] = setting(None, "as data.text_column; null = data.text_column")


@dataclass(frozen=True)
class DataSettings:
    sources: List[SourceSettings] = setting([], "a mixture instead of data.path: a list of "
                                                "{name, weight, path, query or table, format, "
                                                "text_column}; each source is its own ETL cache "
                                                "entry and its own validation loss")
    max_repetitions: Optional[float] = setting(None, "a mixture: refuse a run that would train "
                                                     "on a source more than this many times "
                                                     "(epochs of it); null = no limit",
                                               check=optional(above(0)))
    path: Any = setting(None, "file, directory, glob or URI (s3:// or s3a:// object, prefix or "
                              "glob; hdfs://), or a list of them; null = the built-in sample "
                              "corpus")
    table: Optional[str] = setting(None, "a Delta Lake table (its directory, local or s3://), or "
                                         "with data.catalog an Iceberg namespace.table, instead "
                                         "of data.path: one snapshot's rows, read as "
                                         "data.format's Parquet rows (parquet, chat)")
    catalog: Dict[str, Any] = setting({}, "data.table's Iceberg catalog: its name (default: "
                                          "default) and pyiceberg's properties (type: "
                                          "sql|glue|rest, uri, warehouse, ...); {} = a Delta "
                                          "table")
    table_version: Optional[int] = setting(None, "data.table: the Delta version or Iceberg "
                                                 "snapshot id to read; null = the latest when "
                                                 "the run starts",
                                           check=optional(at_least(0)))
    table_since: Optional[str] = setting(None, "data.table: only the rows appended after this "
                                               "version or snapshot id, or model: the one "
                                               "model.path's model learned from; null = every "
                                               "row of the snapshot")
    table_as_of: Optional[str] = setting(None, "data.table: read the last version committed at "
                                               "this ISO time (2026-12-01T10:00:00+00:00) "
                                               "instead; null = see data.table_version")
    markdown: bool = setting(False, "strip markdown markup from data.path files (the sample is "
                                    "always stripped)")
    max_files: Optional[int] = setting(None, "use only the first N files (sorted by path); null = "
                                             "all", check=OPTIONAL_COUNT)
    document_split: str = setting(DocumentSplit.file, f"where documents end: "
                                  f"{DocumentSplit.listed()} (an end-of-document token joins them)",
                                  check=one_of(DocumentSplit))
    sampling: str = setting(WindowSampling.stride, "how training windows are cut from the token "
                            f"stream: {WindowSampling.listed()}", check=one_of(WindowSampling))
    stride: Optional[int] = setting(None, "tokens between training window starts; null = "
                                          "model.block_size (no overlap); smaller = overlapping "
                                          "windows (no new ETL: windows are cut when read)",
                                    check=OPTIONAL_COUNT)
    val_stride: Optional[int] = setting(None, "the same for validation windows; null = "
                                              "model.block_size (every token scored once)",
                                        check=OPTIONAL_COUNT)
    chunk_tokens: int = setting(262144, "tokens per stored chunk of the stream: the unit a worker "
                                        "reads", check=COUNT)
    halo_tokens: int = setting(1024, "tokens stored after each chunk, so windows are cut from one "
                                     "chunk: the largest model.block_size the ETL output serves",
                               check=COUNT)
    split: str = setting(ValidationSplit.tail, ValidationSplit.listed(),
                         check=one_of(ValidationSplit))
    val_fraction: float = setting(0.1, "fraction of tokens held out for validation, in (0, 1)",
                                  check=FRACTION)
    segment_tokens: int = setting(8192, "hash split: tokens per chunk assigned to train or "
                                        "validation", check=COUNT)
    skip_binary: bool = setting(False, "skip files with NUL bytes (with a warning) instead of "
                                       "failing")
    strict_utf8: bool = setting(False, "fail on invalid UTF-8 instead of replacing (and counting) "
                                       "it")
    cache: bool = setting(True, "reuse the ETL output of an earlier run with the same inputs and "
                                "settings (skips Spark)")
    cache_dir: str = setting("${oc.env:HOME}/.cache/raydp_llm/etl",
                             "where ETL outputs are kept (Parquet + tokenizer + manifest): a "
                             "directory, or s3://bucket/prefix, which every node of a cluster "
                             "reads")
    format: str = setting(DataFormat.text, f"{DataFormat.listed()}; text, ids and jsonl files may "
                                           "be .gz, .bz2 or .zst", check=one_of(DataFormat))
    text_column: str = setting("text", "parquet, jsonl and sql: the column or field holding the "
                                       "text; each row or line is a document")
    query: Optional[str] = setting(None, "sql and chat: a Spark SQL query whose rows are the "
                                         "documents (or conversations), over the session's "
                                         "catalog (Hive support on) or files (parquet.`path`); "
                                         "data.path is then unused")
    messages_column: str = setting("messages", "chat: the column or field holding a list of "
                                               "{role, content} messages")
    prompt_column: str = setting("prompt", "chat: without a messages column, a user turn from "
                                           "this column ...; preference: the prompt (a string, "
                                           "or its messages)")
    response_column: str = setting("response", "... and an assistant turn from this one")
    chosen_column: str = setting("chosen", "preference: the preferred answer (a string, or its "
                                           "messages; without a prompt, the whole conversation, "
                                           "whose first messages shared with the rejected one "
                                           "are the prompt)")
    rejected_column: str = setting("rejected", "preference: the other answer, alike")
    chat_template: Optional[str] = setting(None, "chat: a Jinja chat template file, or chatml "
                                                 "(built in); null = the model's own (model.path: "
                                                 "tokenizer_config.json or chat_template.jinja), "
                                                 "else chatml")
    train_on: str = setting(TrainOn.assistant, f"chat: the tokens the loss counts: "
                            f"{TrainOn.listed()}", check=one_of(TrainOn))
    packing: bool = setting(True, "chat: several conversations per window, each attending only "
                                  "to itself (positions restart); false = one per window, padded")
    overlong: str = setting(Overlong.drop, "chat: a conversation longer than model.block_size + "
                            f"1 tokens (preference: a pair with such a side): "
                            f"{Overlong.listed()}", check=one_of(Overlong))
    max_dropped: float = setting(0.2, "chat, preference: the share of conversations or pairs a "
                                      "run may leave out (too long for model.block_size, no "
                                      "answer) before it stops with one line; 1 = any",
                                 check=Check(lambda v: 0 <= v <= 1, "a share in [0, 1]"))
    strict_json: bool = setting(False, "jsonl: fail on the first bad line (not JSON, no "
                                       "data.text_column, not a string), naming its file and line, "
                                       "instead of skipping it (bad lines are counted in "
                                       "manifest.json); preference: the same for a pair missing "
                                       "an answer")
    vocab_size: Optional[int] = setting(None, "ids: the vocabulary size; null = the largest id + 1",
                                        check=OPTIONAL_COUNT)
    dedup: str = setting(Dedup.none, Dedup.listed(), check=one_of(Dedup))
    dedup_threshold: float = setting(0.8, "near: the Jaccard similarity of shingle sets from "
                                          "which two documents are duplicates, in (0, 1]",
                                     check=Check(lambda v: 0 < v <= 1, "a similarity in (0, 1]"))
    dedup_shingle: str = setting(Shingle.word, "near: shingles of words or characters: "
                                 f"{Shingle.listed()}", check=one_of(Shingle))
    dedup_ngram: int = setting(5, "near: words (or characters) per shingle", check=COUNT)
    dedup_num_perm: int = setting(128, "near: MinHash functions per signature",
                                  check=at_least(2))
    dedup_lowercase: bool = setting(True, "exact: compare documents case-folded")
    dedup_whitespace: bool = setting(True, "exact: compare documents with runs of white space as "
                                           "one space, ends stripped")
    filters: FilterSettings = setting(FilterSettings(), "quality filters, each off while null")
    decontaminate: str = setting(Decontaminate.report, f"{Decontaminate.listed()}; text formats "
                                 "only", check=one_of(Decontaminate))
    decontaminate_ngram: int = setting(13, "words per n-gram of the contamination check (GPT-3: "
                                           "13)", check=COUNT)

    @property
    def chat(self) -> bool:
        """Conversations (``data.format=chat``: rendered with a template, masked, packed) or
        preference pairs (``pairs``: rendered and masked alike, never packed). The one place that
        answers "is this chat data"."""
        return self.format in (DataFormat.chat, DataFormat.preference)

    @property
    def pairs(self) -> bool:
        """Preference pairs (``data.format=preference``): rendered as chat is, each pair two
        records, the chosen side's then the rejected side's, a window."""
        return self.format == DataFormat.preference
