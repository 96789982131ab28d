"""Run metrics: ``metrics.csv`` and TensorBoard events written live on the driver's node by a Ray Train callback,
and ``summary.json``."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from ray.train import UserCallback

# One row per evaluation. Losses are mean cross-entropy per token (nats); ppl = exp(val_loss); bpc = bits per
# character (val_loss / ln 2 / characters per token); acc = top-1 next-token accuracy; grad_norm = mean total
# gradient norm before clipping; grad_abs_* = magnitudes of all gradient entries at the reporting step;
# step_time_s = mean wall time of an optimizer step; mfu = model FLOPs utilization against train.peak_flops;
# memory in MiB; CPU load in percent (process: of one core; sys: of all cores).
COLUMNS = ["step", "epoch", "tokens", "lr", "train_loss", "val_loss", "val_ppl", "val_bpc", "train_acc", "val_acc",
           "grad_norm", "grad_abs_mean", "grad_abs_min", "grad_abs_max", "grad_abs_var", "tokens_per_s",
           "step_time_s", "mfu", "rss_mb", "sys_mem_used_mb", "sys_mem_total_mb", "cpu_percent", "sys_cpu_percent",
           "gpu_mem_mb", "elapsed_s"]


class MetricsWriter(UserCallback):
    """After each ``ray.train.report``: rank 0's metrics as a row of ``csv_path`` and as TensorBoard scalars in
    ``tensorboard_dir`` (``tensorboard --logdir <run dir>/tensorboard``), against the step.

    Runs in the Ray Train controller, which Ray places on the driver's node.
    """

    def __init__(self, csv_path: Path, tensorboard_dir: Path):
        self.path, self.tensorboard_dir, self._events = Path(csv_path), Path(tensorboard_dir), None

    def after_report(self, run_context, metrics, checkpoint):
        row = {k: metrics[0].get(k) for k in COLUMNS}  # None: not measured (e.g. GPU memory on CPU)
        new = not self.path.exists()
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)
        if self._events is None:
            from torch.utils.tensorboard import SummaryWriter

            self._events = SummaryWriter(str(self.tensorboard_dir))
        for key, value in row.items():
            if key != "step" and value is not None:
                self._events.add_scalar(key, value, global_step=int(row["step"]))
        self._events.flush()


def read_metrics(path: Path) -> list[dict]:
    """The rows of ``metrics.csv`` as floats (None where a value was not measured)."""
    with Path(path).open() as f:
        return [{k: float(v) if v != "" else None for k, v in row.items()} for row in csv.DictReader(f)]


def write_summary(path: Path, rows: list[dict], **totals) -> dict:
    """``summary.json`` from the metrics rows plus the run's totals (params, phase times, ETL manifest)."""
    val = [r["val_loss"] for r in rows if r["val_loss"] is not None and not math.isnan(r["val_loss"])]
    last = rows[-1] if rows else {}
    summary = {
        "final_val_loss": val[-1] if val else None,
        "best_val_loss": min(val) if val else None,
        "first_val_loss": val[0] if val else None,
        "final_val_bpc": last.get("val_bpc"),
        "final_val_acc": last.get("val_acc"),
        "final_train_loss": rows[-1]["train_loss"] if rows else None,
        "steps": int(rows[-1]["step"]) if rows else 0,
        "tokens": int(rows[-1]["tokens"]) if rows else 0,
        "tokens_per_s": (rows[-1]["tokens"] / rows[-1]["elapsed_s"]) if rows and rows[-1]["elapsed_s"] else None,
        **totals,
    }
    Path(path).write_text(json.dumps(summary, indent=2))
    return summary
