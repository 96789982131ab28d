"""The loss curves of a run as a PNG: train and validation loss against tokens seen, from ``metrics.csv``."""

from __future__ import annotations

import math
from pathlib import Path

from raydp_llm.errors import InputError
from raydp_llm.metrics import read_metrics


def plot_loss(metrics_csv: Path, out_png: Path, title: str | None = None) -> Path:
    """Draw ``metrics_csv``'s train and validation loss against tokens into ``out_png``; returns ``out_png``.

    The title defaults to the run directory's name (the folder holding ``metrics.csv``). Rows without a loss
    (empty or NaN) are skipped on that curve. Uses matplotlib's Agg canvas: no display, no pyplot state.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics_csv, out_png = Path(metrics_csv), Path(out_png)
    rows = read_metrics(metrics_csv) if metrics_csv.is_file() else []
    if not rows:
        raise InputError(f"{metrics_csv}: no metrics rows to plot; give the metrics.csv of a run that evaluated")
    fig = Figure(figsize=(7, 4.5), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        points = [(r["tokens"], r[key]) for r in rows if r[key] is not None and not math.isnan(r[key])]
        ax.plot(*zip(*points), marker="o", markersize=3, label=label)
    ax.set(xlabel="tokens", ylabel="loss", title=title or metrics_csv.resolve().parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    return out_png
