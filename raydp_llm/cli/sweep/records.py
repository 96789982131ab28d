"""Each job's row of a sweep, kept as it ends in ``<sweep dir>/jobs.jsonl`` (one JSON object a
line, a later row of a job replacing an earlier one): the summary reads them at the end, and a
sweep run again over the same directory knows which jobs it has done (sweep/launcher.py)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

ROWS_FILE = "jobs.jsonl"
# a job's status: it ran to its last step | a scheduler stopped it early (sweep.scheduler) | its
# run failed (the error's line in ``error``)
COMPLETED, STOPPED, FAILED = "completed", "stopped", "failed"
DONE = (COMPLETED, STOPPED)  # a sweep run again does not run these jobs again
# set by the launcher when Ctrl-C or SIGTERM ended the sweep's trials before their end
interrupted = False
FIGURES = ("best_val_loss", "final_val_loss", "final_val_bpc", "tokens_per_s")


def iso(seconds: float) -> str:
    """A ``time.time()`` as an ISO time of the machine's zone, to the second."""
    return datetime.fromtimestamp(seconds, timezone.utc).astimezone().isoformat(timespec="seconds")


def job_row(num: int, overrides: list[str], out_dir: Path, span: tuple[float, float],
            error: str | None = None) -> dict:
    """The row of job ``num`` that ran in ``out_dir`` from ``span[0]`` to ``span[1]``
    (``time.time()``s): completed when its summary says it finished, failed with ``error``,
    stopped otherwise; its figures from its summary, or from its ``metrics.csv`` as far as it
    got."""
    summary = _summary(out_dir)
    status = FAILED if error else (COMPLETED if summary else STOPPED)
    figures = summary or _figures(out_dir / "metrics.csv")
    started, ended = span
    return {"job": num, "overrides": list(overrides), "status": status,
            "steps": figures.get("steps"), **{k: figures.get(k) for k in FIGURES},
            "wall_s": round(ended - started, 1), "started": iso(started), "ended": iso(ended),
            "output_dir": str(out_dir), "error": error}


# Overrides that say how or where a sweep runs, not what a job trains: a sweep run again with other
# values of these (more CPUs, another cap on trials at once, the MLflow server) continues the jobs
# of the first run
NOT_DEFINING = ("sweep.", "cluster.", "hydra.", "hydra/", "tracking.", "tracking=")


def defining(overrides: list[str]) -> list[str]:
    """What defines a job: its overrides, less those of ``NOT_DEFINING``, in a fixed order."""
    return sorted(o for o in overrides if not o.lstrip("+~").startswith(NOT_DEFINING))


def is_done(row: dict | None, overrides: list[str]) -> bool:
    """Whether ``row`` says the job of these ``overrides`` ran (completed or stopped): a sweep run
    again over its directory leaves it out."""
    return (row is not None and row["status"] in DONE
            and defining(row["overrides"]) == defining(overrides))


def finished(out_dir: Path, overrides: list[str]) -> bool:
    """Whether the run of the job of these ``overrides`` finished in ``out_dir`` (its
    ``summary.json`` says so, its ``.hydra/overrides.yaml`` names the job), whether or not its row
    was kept: a sweep killed between the two does not train it again."""
    return bool(_summary(out_dir)) and ran(out_dir, overrides)


def ran(out_dir: Path, overrides: list[str]) -> bool:
    """Whether ``out_dir`` holds a run of the job of these ``overrides``: its
    ``.hydra/overrides.yaml`` names the job."""
    import yaml

    named = out_dir / ".hydra" / "overrides.yaml"
    return named.is_file() and \
        defining(yaml.safe_load(named.read_text()) or []) == defining(overrides)


def span_of(out_dir: Path) -> tuple[float, float]:
    """When a finished run in ``out_dir`` began and ended, as its files say: its Hydra directory
    was written first, its summary last."""
    return (out_dir / ".hydra").stat().st_mtime, (out_dir / "summary.json").stat().st_mtime


def append(sweep_dir: Path, row: dict) -> None:
    with (sweep_dir / ROWS_FILE).open("a") as f:
        f.write(json.dumps(row) + "\n")


def rows(sweep_dir: Path) -> dict[int, dict]:
    """The row of each job, by job number: its newest, except that a completed or stopped row is
    never replaced by a later failed one of the same job (a rerun refused for its used directory);
    a line cut short by a kill is skipped."""
    path, found = sweep_dir / ROWS_FILE, {}
    if not path.is_file():
        return found
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        kept = found.get(row["job"])
        if kept is None or row["status"] in DONE or not is_done(kept, row["overrides"]):
            found[row["job"]] = row
    return found


def _summary(out_dir: Path) -> dict:
    """A finished run's figures (and ``steps``) from its ``summary.json``."""
    path = out_dir / "summary.json"
    if not path.is_file():
        return {}
    summary = json.loads(path.read_text())
    if summary.get("status") != "finished" or is_nan(summary.get("final_val_loss")):
        return {}
    return summary


def _figures(metrics_csv: Path) -> dict:
    """What a stopped run reached, from its ``metrics.csv``: its last step and validation loss,
    its best validation loss."""
    from raydp_llm.training.driver.metrics import read_metrics

    rows = read_metrics(metrics_csv) if metrics_csv.is_file() else []
    losses = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    if not rows:
        return {}
    return {"steps": int(rows[-1]["step"]), "final_val_loss": losses[-1] if losses else None,
            "best_val_loss": min(losses) if losses else None,
            "final_val_bpc": rows[-1].get("val_bpc"), "tokens_per_s": rows[-1].get("tokens_per_s")}


def last_value(out_dir: Path, column: str) -> float | None:
    """The last value of ``column`` in a run's ``metrics.csv``; None if it has none."""
    from raydp_llm.training.driver.metrics import read_metrics

    path = out_dir / "metrics.csv"
    values = [r[column] for r in read_metrics(path) if r.get(column) is not None] \
        if path.is_file() else []
    return float(values[-1]) if values else None


def best_value(out_dir: Path, column: str, mode: str) -> float | None:
    """The best (``mode``: min or max) value of ``column`` in a run's ``metrics.csv``; None if it
    has none."""
    from raydp_llm.training.driver.metrics import read_metrics

    path = out_dir / "metrics.csv"
    values = [float(r[column]) for r in read_metrics(path)
              if r.get(column) is not None and not is_nan(r[column])] if path.is_file() else []
    if not values:
        return None
    return min(values) if mode == "min" else max(values)


def is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def last_error(log_file: Path) -> str | None:
    """The message of the last ERROR line of a job's log (Hydra's ``[time][logger][ERROR] -
    message`` lines)."""
    if not log_file.is_file():
        return None
    errors = [
        line.split("] - ", 1)[-1] for line in log_file.read_text().splitlines() if "[ERROR]" in line
    ]
    return errors[-1] if errors else None
