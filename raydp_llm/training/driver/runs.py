"""Run identity: every run owns its directory, leaves a record beside its checkpoints, and
``train.resume=auto`` continues only what no live run is continuing.

A run claims its output directory by creating ``run.json`` there (exclusively: a second run is
refused) and writes the same record into its Ray Train run directory (``ray_results/<run>/`` or
``<storage_path>/<run>/``): its id, host, pid, what it resumed from, and a heartbeat refreshed every
``HEARTBEAT_S`` while it trains. A run is live while its process exists (same host) or its heartbeat
is fresh (another host); a killed run holds neither, so its checkpoints become resumable at once on
its own machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

import psutil

from raydp_llm.checkpoint.layout import STATE_JSON
from raydp_llm.core import integrity, storage
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options

log = logging.getLogger(__name__)

RECORD = "run.json"
HEARTBEAT_S = 30.0
OUTPUTS = ("metrics.csv", "summary.json", "model")  # what a run writes into its directory


def new_run_id() -> str:
    """``YYYYmmdd-HHMMSS-xxxxxx``: sorts by start time; the random tail tells apart runs of the same
    second."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@dataclass
class RunRecord:
    run_id: str
    out_dir: str
    resumed_from: str | None = None
    mlflow_run_id: str | None = None  # tracking=mlflow: the MLflow run it logs to
    status: str = "running"  # running | finished | failed | diverged | interrupted
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    pid_started: float = field(default_factory=lambda: psutil.Process().create_time())
    heartbeat: float = field(default_factory=time.time)
    # data.table's snapshot, once the data is known (data/inputs/tables.py); a mixture's: the
    # snapshot of each of its sources that reads a table, by source name
    table: dict | None = None
    source_tables: dict[str, dict] | None = None

    def alive(self) -> bool:
        """Whether the run that wrote this record may still be running."""
        if self.status != "running":
            return False
        if self.host != socket.gethostname():
            return time.time() - self.heartbeat < 3 * HEARTBEAT_S
        try:
            return abs(psutil.Process(self.pid).create_time() - self.pid_started) < 0.01
        except psutil.NoSuchProcess:
            return False

    def describe(self) -> str:
        return f"run {self.run_id} (pid {self.pid} on {self.host})"

    def tables_read(self) -> dict[str, dict]:
        """The table snapshots the run read, by source name ("" for ``data.table``)."""
        return {"": self.table} if self.table else dict(self.source_tables or {})

    def learned_from(self) -> dict | None:
        """What the model's ``training_data.json`` says it learned from: ``data.table``'s
        snapshot, or a mixture's sources' snapshots by name; None for data of no table."""
        if self.table:
            return {"table": self.table}
        return {"sources": self.source_tables} if self.source_tables else None


def run_dir_of(checkpoint: str) -> str:
    """The Ray Train run directory holding ``checkpoint`` (a path or s3:// URI): where that run's
    record lies."""
    return str(checkpoint).rstrip("/").rsplit("/", 1)[0]


def read_record(uri: str, s3: S3Options = S3Options()) -> RunRecord | None:
    try:
        return RunRecord(**storage.read_json(uri, s3))
    except (OSError, ValueError, TypeError):
        return None


def claim(out_dir: Path, record: RunRecord) -> None:
    """Make ``out_dir`` this run's: refused, with one line, when another run has written there."""
    check_unused(out_dir)
    try:
        fd = os.open(out_dir / RECORD, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:  # another run claimed it since the check
        check_unused(out_dir)
        raise
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(record), f, indent=1)


@contextlib.contextmanager
def claimed(out_dir: Path, record: RunRecord) -> Iterator[None]:
    """``claim`` for the block; a run refused for its input (``InputError``) before it wrote any
    output or checkpoint gives the directory back, so the corrected command may use it."""
    claim(out_dir, record)
    try:
        yield
    except InputError:
        written = [name for name in (*OUTPUTS, "ray_results") if (out_dir / name).exists()]
        if not written:
            (out_dir / RECORD).unlink(missing_ok=True)
        raise


def check_unused(out_dir: Path) -> None:
    """One line when another run has written into ``out_dir`` (its record, its metrics, summary or
    model)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [name for name in (RECORD, *OUTPUTS) if (out_dir / name).exists()]
    if not written:
        return
    other = read_record(str(out_dir / RECORD))
    if other:
        written[0] = other.describe()
    raise InputError(f"{out_dir}: another run wrote there already ({', '.join(written)}); leave "
                     "hydra.run.dir at its default (a new directory per run) or name a new "
                     "directory")


def refuse_used_run_dir(argv: list[str] | None = None) -> None:
    """For an explicit ``hydra.run.dir=DIR`` on the command line: exit with one line, before Hydra
    writes its own files (``.hydra/``, the log) there, when another run wrote into DIR."""
    for arg in sys.argv[1:] if argv is None else argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra.run.dir" and "${" not in value and Path(value).is_dir():
            try:
                check_unused(Path(value))
            except InputError as err:
                print(f"error: {err}", file=sys.stderr)
                sys.exit(2)  # bad input, as cli/common.cli_errors ends it


class RecordKeeper:
    """Keeps this run's record current in its places (the run directory and the Ray Train run
    directory): a heartbeat every ``HEARTBEAT_S`` while training, the final status at the end."""

    def __init__(self, record: RunRecord, places: list[str], s3: S3Options):
        self.record, self.places, self.s3 = record, places, s3
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="run-heartbeat")

    def write(self) -> None:
        text = json.dumps(asdict(self.record), indent=1)
        for place in self.places:
            with contextlib.suppress(OSError):  # a missed beat is retried; S3 may flap
                storage.write_text(place, text, self.s3)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.record.heartbeat = time.time()
            self.write()

    @contextlib.contextmanager
    def beating(self) -> Iterator[RecordKeeper]:
        self.write()
        self._thread.start()
        try:
            yield self
        except KeyboardInterrupt:
            self.finish("interrupted")
            raise
        except BaseException:
            self.finish("failed")
            raise
        finally:
            self._stop.set()

    def finish(self, status: str) -> None:
        self.record.status, self.record.heartbeat = status, time.time()
        self.write()


@dataclass
class Candidate:
    step: int
    mtime_ns: int
    checkpoint: str  # the checkpoint directory (path or s3:// URI)
    run_dir: str  # the Ray Train run directory holding it


def find_resumable(root: str | Path, fingerprint: str, max_steps: int, s3: S3Options = S3Options(),
                   run_prefix: str | tuple[str, ...] = "") -> str | None:
    """The newest complete checkpoint under ``root`` (local or S3) that ``train.resume=auto`` may
    continue: of a run with the same ``fingerprint`` whose path below ``root`` starts with
    ``run_prefix`` (or one of them), that did not finish (reach ``max_steps``), is not running
    now, and was not continued by a run that finished or is running. A damaged checkpoint is
    skipped with one line, and the one before it is taken."""
    candidates, finished = [], set()
    for path, relative, info in storage.find_files(root, STATE_JSON, s3):
        if not relative.startswith(run_prefix):
            continue
        try:
            state = storage.read_json(path, s3)
        except (OSError, ValueError):  # half written: its checkpoint is skipped below, with a line
            state = {"fingerprint": fingerprint, "step": -1}
        if state.get("fingerprint") != fingerprint:
            continue
        checkpoint, run_dir = path.rsplit("/", 1)[0], path.rsplit("/", 2)[0]
        candidates.append(Candidate(state["step"], info.mtime_ns, checkpoint, run_dir))
        if state["step"] >= max_steps:
            finished.add(run_dir)
    records = {
        run_dir: read_record(storage.join(run_dir, RECORD), s3)
        for run_dir in {c.run_dir for c in candidates}
    }
    taken = _taken_over(root, s3)
    for c in sorted(candidates, key=lambda c: (c.step, c.mtime_ns), reverse=True):
        record = records.get(c.run_dir)
        if c.run_dir in finished or c.run_dir in taken:
            continue
        if record is not None and record.alive():
            log.info("not resuming %s: %s is still running it", c.checkpoint, record.describe())
            continue
        damage = integrity.problem(c.checkpoint, s3)
        if damage:
            log.warning("skipping damaged checkpoint %s: %s", c.checkpoint, damage)
            continue
        return c.checkpoint
    return None


def _taken_over(root: str | Path, s3: S3Options) -> set[str]:
    """The run directories whose checkpoints a finished or live run continued: resuming them again
    would train the same steps twice."""
    taken = set()
    for path, _, _ in storage.find_files(root, RECORD, s3):
        record = read_record(path, s3)
        if record and record.resumed_from and (record.status == "finished" or record.alive()):
            taken.add(run_dir_of(record.resumed_from))
    return taken


def run_prefix(settings, out_dir: Path, sweep_dir: str | None) -> str:
    """How the run's Ray Train name (its checkpoints' directory in ``train.storage_path``) begins:
    ``<name>-``; a sweep's job's, ``<name>-sweep<key of the sweep>-job<num>-``, its own."""
    if sweep_dir is None:
        return f"{settings.name}-"
    key = hashlib.sha256(sweep_dir.encode()).hexdigest()[:8]
    return f"{settings.name}-sweep{key}-job{out_dir.name}-"


def resume_scope(settings, out_dir: Path, sweep_dir: str | None
                 ) -> tuple[str | Path, str | tuple[str, ...]]:
    """Where ``train.resume=auto`` looks for earlier runs, and how the paths of this run's kin
    begin there: the ``<name>-*`` runs in ``train.storage_path``, else this run's siblings
    (``outputs/<name>/*``); a sweep's job, only its own earlier attempts."""
    if settings.train.storage_path:
        return settings.train.storage_path, run_prefix(settings, out_dir, sweep_dir)
    mine = ("",) if sweep_dir is None else (f"{out_dir.name}/", f"{out_dir.name}.attempt-")
    return out_dir.parent, mine


def resumed_snapshot(root: str | Path, kin: str | tuple[str, ...], uris: dict[str, str],
                     s3: S3Options = S3Options()) -> RunRecord | None:
    """The newest earlier run among ``kin`` that read the tables ``uris`` (by source name, "" for
    ``data.table``) and that ``train.resume=auto`` may continue: it did not finish, is not
    running, and no finished or live run continued it."""
    found: dict[str, tuple[RunRecord, set[str]]] = {}  # by run id: the record, its directories
    for path, relative, _ in storage.find_files(root, RECORD, s3):
        record = read_record(path, s3) if relative.startswith(kin) else None
        if record is None or not _read_the_tables(record, uris):
            continue
        if record.status != "finished" and not record.alive():
            found.setdefault(record.run_id, (record, set()))[1].add(path.rsplit("/", 1)[0])
    taken = _taken_over(root, s3) if found else set()
    open_runs = [record for record, places in found.values() if not places & taken]
    return max(open_runs, key=lambda r: r.heartbeat, default=None)


def _read_the_tables(record: RunRecord, uris: dict[str, str]) -> bool:
    read = record.tables_read()
    return all(read.get(name, {}).get("uri") == uri for name, uri in uris.items())


def _unpinned_tables(d) -> dict[str, str]:
    """The tables the data settings read at their latest snapshot, by source name ("" for
    ``data.table``)."""
    if d.table is not None and d.table_version is None and d.table_as_of is None:
        return {"": d.table}
    return {s.name: s.table for s in d.sources if s.table is not None and s.table_version is None}


def pin_resumed_table(settings, out_dir: Path, sweep_dir: str | None):
    """With ``train.resume=auto`` and ``data.table`` (or a mixture's table source) not pinned:
    the snapshot that the run it would continue read (``resumed_snapshot``), pinned as the
    table's ``table_version`` with one line, so that the resumed run reads what its checkpoints
    learned from, whatever the table holds now; else the settings as they are."""
    d = settings.data
    uris = _unpinned_tables(d) if settings.train.resume == "auto" else {}
    if not uris:
        return settings
    root, kin = resume_scope(settings, out_dir, sweep_dir)
    record = resumed_snapshot(root, kin, uris, S3Options.of(settings.s3))
    if record is None:
        return settings
    pins = {name: table.get("version", table.get("snapshot_id"))
            for name, table in record.tables_read().items() if name in uris}
    for name, version in pins.items():
        where = f"data.sources: {name}: table" if name else "data.table"
        log.info("%s=%s: pinned to %s, which run %s read (train.resume=auto continues it; "
                 "train.resume=never reads the latest)", where, uris[name], version,
                 record.run_id)
    if "" in pins:
        return replace(settings, data=replace(d, table_version=pins[""]))
    sources = [replace(s, table_version=pins[s.name]) if s.name in pins else s
               for s in d.sources]
    return replace(settings, data=replace(d, sources=sources))
