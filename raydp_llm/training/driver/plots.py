"""A run's curves as PNGs, from ``metrics.csv`` rows: its train and validation loss (``loss.png``)
and its throughput (``throughput.png``) against tokens seen; and a sweep's validation curves
(``sweep.png``)."""

from __future__ import annotations

import math
from pathlib import Path

from raydp_llm.core.errors import InputError
from raydp_llm.training.driver.metrics import SOURCE_LOSS, read_metrics, source_losses


def plot_loss(metrics_csv: Path, out_png: Path, title: str | None = None) -> Path:
    """Draw ``metrics_csv``'s train and validation loss (a mixture's: per source too) against
    tokens into ``out_png``; returns ``out_png``.

    The title defaults to the run directory's name (the folder holding ``metrics.csv``).
    """
    metrics_csv = Path(metrics_csv)
    rows = read_metrics(metrics_csv) if metrics_csv.is_file() else []
    if not rows:
        raise InputError(f"{metrics_csv}: no metrics rows to plot; give the metrics.csv of a run "
                         "that evaluated")
    curves = {"train": _points(rows, "train_loss"), "validation": _points(rows, "val_loss")}
    for name in source_losses(rows[0]):  # a mixture: each source's validation curve
        curves[f"validation: {name}"] = _points(rows, SOURCE_LOSS + name)
    return _draw(curves, title or metrics_csv.resolve().parent.name, out_png)


def plot_throughput(metrics_csv: Path, out_png: Path) -> Path:
    """``metrics_csv``'s training tokens/s (over all workers, between evaluations) against tokens
    seen."""
    rows = read_metrics(metrics_csv)
    return _draw(
        {"tokens/s": _points(rows, "tokens_per_s")},
        Path(metrics_csv).resolve().parent.name,
        out_png,
        ylabel="training tokens/s",
    )


def plot_sweep(runs: dict[str, list[dict]], out_png: Path, title: str) -> Path:
    """One validation loss curve per job (label → its metrics rows) into ``out_png``; returns
    ``out_png``."""
    return _draw({label: _points(rows, "val_loss") for label, rows in runs.items()}, title, out_png)


def _points(rows: list[dict], key: str) -> list[tuple[float, float]]:
    """(tokens, value) of the rows that have a value (not empty, not NaN)."""
    return [(r["tokens"], r[key]) for r in rows
            if r.get(key) is not None and not math.isnan(r[key])]


def _draw(
    curves: dict[str, list[tuple[float, float]]], title: str, out_png: Path, ylabel: str = "loss"
) -> Path:
    """``ylabel`` against tokens, one line per curve. matplotlib's Agg canvas: no display, no pyplot
    state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, points in curves.items():
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=label)
    ax.set(xlabel="tokens", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    return out_png
