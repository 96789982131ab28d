"""A mixture's data on the driver (``data.sources``): each source through its own ETL or cache
entry (``prepared_sources``), one tokenizer for all, the workers' ``MixtureSpec`` (data/mixture.py),
a mixture that would repeat a source too often refused, and the summary's figures per source."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from raydp_llm.core import storage
from raydp_llm.core.config import Settings, source_settings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import Tokenizer
from raydp_llm.data.cache import ETL_VERSION
from raydp_llm.data.etl.records import Manifest
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.mixture import MixtureSpec, one_tokenizer
from raydp_llm.data.prepare import PreparedData
from raydp_llm.data.stream import RunWindows

log = logging.getLogger(__name__)


@dataclass
class MixedData:
    """The prepared sources of a mixture, in ``data.sources``' order, as a run reads its data
    (``PreparedData``'s interface): the tokenizer they share, the workers' ``mixture``, a manifest
    (the first source's, with the mixture's key, dtype and characters per token) and the windows
    of all."""

    parts: list[PreparedData]
    mixture: MixtureSpec
    tokenizer: Tokenizer
    manifest: Manifest
    windows: RunWindows
    batch_size: int  # the run's: what a step takes of the sources
    block_size: int

    @property
    def cache_hit(self) -> bool:
        return all(p.cache_hit for p in self.parts)

    @property
    def stats(self) -> dict:
        return {name: p.stats for name, p in zip(self.mixture.names, self.parts)}

    @property
    def timings(self) -> dict:
        return {"etl_s": sum(p.timings.get("etl_s", 0.0) for p in self.parts)}

    def splits(self) -> dict[str, list]:
        """Each split's chunks, a ``SplitChunks`` per source (the workers' ``WorkerData``)."""
        return {split: [p.splits()[split] for p in self.parts] for split in ("train", "val")}

    def manifest_json(self) -> dict:
        """The run's ``manifest.json``: the windows of all, and each source's own manifest with
        its weight."""
        sources = {name: p.manifest_json() | {"weight": w, "cache_hit": p.cache_hit}
                   for name, w, p in zip(self.mixture.names, self.mixture.weights, self.parts)}
        return self.windows.to_json() | {"etl_key": self.manifest.etl_key, "sources": sources}

    def summary(self, steps: int) -> dict:
        """``summary.json``'s ``mixture``: per source, its weight, documents and tokens, and what
        ``steps`` steps trained on: tokens, share of all, epochs."""
        order = self.mixture.order(self.batch_size)
        taken, epochs = order.taken(steps * self.batch_size), order.epochs(steps)
        total = max(int(taken.sum()), 1)
        return {name: {"weight": w, "documents": p.manifest.documents,
                       "tokens": p.manifest.tokens, "tokens_trained": int(t) * self.block_size,
                       "share_trained": int(t) / total, "epochs": round(e, 4)}
                for name, w, p, t, e in zip(self.mixture.names, self.mixture.weights,
                                            self.parts, taken, epochs)}


@contextlib.contextmanager
def prepared_sources(session, settings: Settings, corpora: dict[str, Corpus],
                     out_dir: Path) -> Iterator[MixedData]:
    """Each source's ETL (or cache entry) on the job's session (``each_source``), mixed."""
    with contextlib.ExitStack() as held:
        parts = [data for _, data in each_source(session, settings, corpora, out_dir, held,
                                                 to_ray=True)]
        yield mixed(settings, parts)


def each_source(session, settings: Settings, corpora: dict[str, Corpus], out_dir: Path,
                held: contextlib.ExitStack, to_ray: bool) -> Iterator[tuple]:
    """Each source and its data (its ETL or cache entry, held open in ``held``), one after
    another, on one Spark (``session.one_spark``: its logs in ``out_dir``, each source's stats in
    ``out_dir/sources/<name>``), stopped after the last source; a source's bad input is one line
    that names it."""
    with session.one_spark(out_dir, held):
        # the mixture's tokenizer file is read locally (its hash is in the sources' cache keys)
        home = session.store if isinstance(session.store, Path) else out_dir
        settings = with_mixture_bpe(session, settings, corpora, home)
        for source in settings.data.sources:
            logs = out_dir / "sources" / source.name
            logs.mkdir(parents=True, exist_ok=True)
            try:
                data = held.enter_context(session.prepared(
                    corpora[source.name], logs, to_ray=to_ray,
                    settings=source_settings(settings, source)))
            except InputError as err:
                raise InputError(f"data.sources: {source.name}: {err}") from None
            yield source, data


def with_mixture_bpe(session, settings: Settings, corpora: dict[str, Corpus],
                     home: Path) -> Settings:
    """With ``tokenizer=bpe`` and no ``tokenizer.path``: the settings with the mixture's BPE as
    ``tokenizer.path``, trained on a sample of the sources at their weights on the session's Spark
    (``etl/mixture_sample.py``), or found in ``home/tokenizers/`` where a run of the same sources,
    weights and tokenizer settings wrote it (so its sources' ETL cache entries are hits); else the
    settings as they are."""
    tok = settings.tokenizer
    if tok.kind != "bpe" or tok.path:
        return settings
    path = home / "tokenizers" / f"mixture-{mixture_bpe_key(settings, corpora)}.json"
    if not path.is_file():
        from raydp_llm.data.etl.mixture_sample import mixture_bpe
        from raydp_llm.data.etl.records import EtlPlan

        plans = {s.name: EtlPlan.of(source_settings(settings, s), corpora[s.name])
                 for s in settings.data.sources}
        weights = {s.name: s.weight for s in settings.data.sources}
        tokenizer, drawn = mixture_bpe(session.spark.started(session.timings), plans, weights,
                                       tok.sample_mb, tok.vocab_size)
        for d in drawn:
            log.info("mixture BPE: %s (weight %.3g) gave %d of its %d bytes", d.name, d.weight,
                     d.sampled_bytes, d.text_bytes)
        s3 = S3Options.of(settings.s3)  # a run reading them meanwhile sees no half
        storage.write_text(path.with_suffix(".sample.json"),
                           json.dumps([asdict(d) for d in drawn], indent=2), s3)
        storage.write_text(path, tokenizer.to_json(), s3)
    log.info("mixture BPE: %s", path)
    return replace(settings, tokenizer=replace(tok, path=str(path)))


def mixture_bpe_key(settings: Settings, corpora: dict[str, Corpus]) -> str:
    """What the mixture's BPE is made of, hashed: each source's inputs, reading and weight, the
    tokenizer's settings and the seed."""
    sources = [{"name": s.name, "weight": s.weight, "format": s.format, "query": s.query,
                "text_column": s.text_column, "inputs": corpora[s.name].fingerprints,
                "markdown": corpora[s.name].markdown} for s in settings.data.sources]
    blob = json.dumps({"version": ETL_VERSION, "sources": sources, "seed": settings.seed,
                       "format": settings.data.format, "text_column": settings.data.text_column,
                       "tokenizer": asdict(settings.tokenizer)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def mixed(settings: Settings, parts: list[PreparedData]) -> MixedData:
    """The sources as one run's data; one line when it would repeat a source more often than
    ``data.max_repetitions``."""
    sources = settings.data.sources
    names = [s.name for s in sources]
    total = sum(s.weight for s in sources)
    tokenizer, maps = one_tokenizer(names, [p.tokenizer for p in parts])
    mixture = MixtureSpec(tuple(names), tuple(s.weight / total for s in sources),
                          tuple(p.windows.train for p in parts), tuple(maps),
                          tuple(p.manifest.token_dtype for p in parts))
    check_repetitions(settings, mixture)
    per_char = [p.manifest.chars_per_token for p in parts]
    chars = None if None in per_char else sum(w * c for w, c in zip(mixture.weights, per_char))
    keys = "|".join(f"{n}={p.manifest.etl_key}" for n, p in zip(names, parts))
    manifest = replace(parts[0].manifest, token_dtype=str(tokenizer.token_dtype),
                       chars_per_token=chars, vocab_size=tokenizer.vocab_size,
                       etl_key=hashlib.sha256(keys.encode()).hexdigest()[:20])
    first = parts[0].windows
    windows = replace(first, train=sum(p.windows.train for p in parts),
                      val=sum(p.windows.val for p in parts))
    return MixedData(parts, mixture, tokenizer, manifest, windows, settings.train.batch_size,
                     settings.model.block_size)


def check_repetitions(settings: Settings, mixture: MixtureSpec) -> None:
    """``data.max_repetitions``: the epochs of each source that ``train.max_steps`` steps take."""
    limit = settings.data.max_repetitions
    if limit is None:
        return
    steps = settings.train.max_steps
    epochs = mixture.order(settings.train.batch_size).epochs(steps)
    for name, e, n in zip(mixture.names, epochs, mixture.windows):
        if e > limit:
            raise InputError(f"data.max_repetitions={limit:g}: train.max_steps={steps} trains on "
                             f"source {name} {e:.1f} times ({n} windows); set "
                             f"data.max_repetitions={math.ceil(e * 10) / 10:g}, or lower its "
                             "weight or train.max_steps, or give it more data")
