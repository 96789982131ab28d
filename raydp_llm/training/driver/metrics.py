"""Run metrics: ``metrics.csv`` and TensorBoard events written live on the driver's node by a Ray
Train callback, the run's restarts (``events.jsonl``), a divergence (``diverged.json``), and
``summary.json``.

After a restart (a lost worker, an elastic resize) the workers go on from the last checkpoint and
report its later steps again: each step is kept once, the newer report replacing the older (rows and
TensorBoard points).
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from ray.train import UserCallback

from raydp_llm.core.dpo_config import DPO_FIGURES
from raydp_llm.core.errors import first_line

# One row per evaluation. Losses are mean cross-entropy per token (nats); ppl = exp(val_loss); bpc =
# bits per character (val_loss / ln 2 / characters per token); acc = top-1 next-token accuracy.
# With train.objective=dpo the losses are DPO's, per pair; acc is the reward accuracy (the share of
# pairs whose chosen answer has the higher reward); the *_reward, *_margin and *_logp columns are
# per-pair means (training/objectives/dpo_loss.py), empty otherwise; ppl and bpc are empty.
# grad_norm = mean total gradient norm before clipping; grad_abs_* = magnitudes of all gradient
# entries at the reporting step; step_time_s = mean wall time of an optimizer step; mfu = model
# FLOPs utilization against train.peak_flops; memory in MiB; CPU load in percent (process: of one
# core; sys: of all cores); workers = DDP workers training.
COLUMNS = [
    "step",
    "epoch",
    "tokens",
    "lr",
    "train_loss",
    "val_loss",
    "val_ppl",
    "val_bpc",
    "train_acc",
    "val_acc",
    "grad_norm",
    "grad_abs_mean",
    "grad_abs_min",
    "grad_abs_max",
    "grad_abs_var",
    "tokens_per_s",
    "step_time_s",
    "mfu",
    "rss_mb",
    "sys_mem_used_mb",
    "sys_mem_total_mb",
    "cpu_percent",
    "sys_cpu_percent",
    "gpu_mem_mb",
    "elapsed_s",
    "workers",
    "windows_read",
    "chunks_read",
    *(f"{split}_{figure}" for figure in DPO_FIGURES for split in ("train", "val")),
]
# what a GRPO run never fills: its held-out prompts' answers are scored, not a loss
LM_ONLY = ("val_loss", "val_ppl", "val_bpc", "train_acc", "val_acc", "mfu", "chunks_read",
           *(c for c in COLUMNS if c.endswith(DPO_FIGURES)))
SOURCE_LOSS = "val_loss_"  # a mixture's validation loss per source: val_loss_<name>
TASK = "task_"  # train.eval_tasks' scores: task_<task>_<metric>
METRICS_FILE, EVENTS_FILE, DIVERGED_FILE = "metrics.csv", "events.jsonl", "diverged.json"


def columns_of(metrics: dict) -> list[str]:
    """``metrics.csv``'s columns for a worker's ``metrics``: ``COLUMNS``, then a mixture's
    ``val_loss_<name>`` in its sources' order, then the ``task_<task>_<metric>`` scores of
    ``train.eval_tasks`` (at the evaluations that scored them); a GRPO run's rewards and answers
    (training/objectives/grpo.py) after them, each reward function's too."""
    extra = [k for k in metrics if k.startswith((SOURCE_LOSS, TASK))]
    if "reward_mean" in metrics:
        extra += [k for k in metrics if k not in COLUMNS and k not in extra]
        return [c for c in COLUMNS if c not in LM_ONLY] + extra
    return COLUMNS + extra


def source_losses(row: dict) -> dict[str, float]:
    """A metrics row's validation loss per source (a mixture's), by source name."""
    return {k.removeprefix(SOURCE_LOSS): v for k, v in row.items()
            if k.startswith(SOURCE_LOSS) and v is not None}
LOST = (
    "WorkerHealthCheckFailedError",
    "ActorDiedError",
    "ActorUnavailableError",
    "RayActorError",
    "NodeDiedError",
)


class MetricsWriter(UserCallback):
    """Runs in the Ray Train controller, which Ray places on the driver's node, and writes into
    ``out_dir``:

    - after each ``ray.train.report``, rank 0's metrics as a row of ``metrics.csv`` and as
      TensorBoard scalars in ``tensorboard/`` (``tensorboard --logdir <run dir>/tensorboard``),
      against the step;
    - ``diverged.json`` when the workers report a non-finite loss, gradient norm or weight;
    - a line of ``events.jsonl`` per restart of the worker group (which workers failed, from which
      checkpoint step it goes on) and per elastic resize (a report from another number of workers
      than the last, with no failure between).

    The driver reads these files (``read_divergence``, ``read_events``): the callback object it
    holds is a copy. ``max_failures`` is the run's ``FailureConfig``'s: a failure beyond it ends
    the run instead of restarting it.
    """

    def __init__(self, out_dir: Path, max_failures: int = 0):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / METRICS_FILE
        self.max_failures = max_failures
        self._events: ScalarEvents | None = None  # opened on the first row
        self._last_step = -1
        self._checkpoint: dict | None = None  # the last registered checkpoint: step and path
        self._failures = 0
        self._workers: int | None = None  # those of the last report; None after a failure

    # ------------------------------------------------------------------ reports
    def after_report(self, run_context, metrics, checkpoint):
        if self._workers is not None and len(metrics) != self._workers:
            self._write_event({"event": "resize", "workers": len(metrics)})
        self._workers = len(metrics)
        first = metrics[0]
        if "diverged" in first:
            record = {
                "step": first["step"],
                "what": first["diverged"],
                "last_checkpoint": self._checkpoint,
                "stopped": bool(first.get("stopped")),
            }
            (self.out_dir / DIVERGED_FILE).write_text(json.dumps(record, indent=1))
            return
        if checkpoint is not None:
            self._checkpoint = {"step": first["step"], "path": checkpoint.path}
        # None: not measured (e.g. GPU memory on CPU)
        row = {k: first.get(k) for k in columns_of(first)}
        self._write_row(row)

    def _write_row(self, row: dict) -> None:
        step = int(row["step"])
        if (
            step <= self._last_step
        ):  # a restart reports these steps again: the new rows replace the old
            kept = [r for r in _read_rows(self.path) if float(r["step"]) < step]
            _rewrite(self.path, kept)
            self._reopen_events(purge_step=step)
        new = not self.path.exists()
        columns = list(row) if new else _widened(self.path, row)
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            if new:
                writer.writeheader()
            writer.writerow(row)
        self._last_step = step
        if self._events is None:
            self._reopen_events(purge_step=None)
        for key, value in row.items():
            if key != "step" and value is not None:
                self._events.add_scalar(key, value, global_step=step)
        self._events.flush()

    def _reopen_events(self, purge_step: int | None) -> None:
        """TensorBoard's writer; ``purge_step`` hides the points from that step on that an earlier
        attempt wrote."""
        if self._events is not None:
            self._events.close()
        self._events = ScalarEvents(self.out_dir / "tensorboard", purge_step=purge_step)

    # ------------------------------------------------------------------ failures
    def after_exception(self, run_context, worker_exceptions: dict) -> None:
        """Ray Train polled the worker group and found ``worker_exceptions`` (``{rank: error}``):
        it restarts the group from the last checkpoint while ``max_failures`` allows."""
        self._failures += 1
        self._workers = None
        if 0 <= self.max_failures < self._failures:
            return  # the run fails: fit raises the error
        # The lost workers fail their health check (or die); the others fail after them (a
        # collective aborts).
        self._write_event({
            "event": "restart",
            "lost": sorted(int(rank) for rank, err in worker_exceptions.items()
                           if type(err).__name__ in LOST),
            "errors": {int(rank): first_line(err, 160, with_type=True)
                       for rank, err in worker_exceptions.items()},
        })

    def _write_event(self, event: dict) -> None:
        step = self._checkpoint["step"] if self._checkpoint else None
        with (self.out_dir / EVENTS_FILE).open("a") as f:
            f.write(json.dumps(event | {"from_step": step, "time": time.time()}) + "\n")


class ScalarEvents:
    """TensorBoard scalars in an event file, as torch's ``SummaryWriter`` writes them, without
    torch: the controller writes them, and torch's writer would import torch there (2.7 s of CPU
    beside the first training steps on 2 cores). ``purge_step``: TensorBoard hides the points an
    earlier writer wrote from that step on (a restarted group reports them again)."""

    def __init__(self, log_dir: Path, purge_step: int | None = None):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(str(log_dir))
        if purge_step is not None:
            self._writer.add_event(Event(step=purge_step, file_version="brain.Event:2",
                                         wall_time=time.time()))
            self._writer.add_event(Event(step=purge_step, wall_time=time.time(),
                                         session_log=SessionLog(status=SessionLog.START)))

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
        self._writer.add_event(Event(summary=summary, step=int(global_step),
                                     wall_time=time.time()))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _read_rows(path: Path) -> list[dict]:
    with Path(path).open() as f:
        return list(csv.DictReader(f))


def _widened(path: Path, row: dict) -> list[str]:
    """The file's columns, and the columns of ``row`` it lacks (task scores come at some
    evaluations only): the file rewritten with them, the earlier rows empty there."""
    with path.open() as f:
        header = next(csv.reader(f), [])
    more = [k for k in row if k not in header]
    if more:
        _rewrite(path, _read_rows(path), header + more)
    return header + more


def _rewrite(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns or (list(rows[0]) if rows else COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def read_events(out_dir: Path) -> list[dict]:
    """The restarts and resizes the run's controller recorded, oldest first."""
    path = Path(out_dir) / EVENTS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@dataclass(frozen=True)
class Divergence:
    """Where a run diverged: the step, what was not finite, and the last checkpoint Ray Train
    registered before it (``{"step", "path"}``), if any. The controller's callback writes it
    (``diverged.json``): it runs in another process than the driver that reads it."""

    step: int
    what: str
    last_checkpoint: dict | None
    stopped: bool = False  # not a divergence: the run could not go on (``what`` says why)

    def line(self, out_dir: Path) -> str:
        """The run's one line: where it diverged (or stopped), and what to do."""
        if self.stopped:
            return f"the run stopped at step {self.step}: {self.what}; metrics in {out_dir}"
        last = self.last_checkpoint
        if last:
            where = (f"the last good checkpoint is {last['path']} (step {last['step']}): lower "
                     "optim.lr or set optim.grad_clip, then continue from it with "
                     f"train.resume={last['path']}")
        else:
            where = ("no checkpoint was taken before it: lower optim.lr or set optim.grad_clip "
                     "and start again")
        return (f"training diverged at step {self.step} ({self.what}); {where}; metrics in "
                f"{out_dir}")


def read_divergence(out_dir: Path) -> Divergence | None:
    """The run's divergence, if it diverged."""
    path = Path(out_dir) / DIVERGED_FILE
    return Divergence(**json.loads(path.read_text())) if path.is_file() else None


def read_metrics(path: Path) -> list[dict]:
    """The rows of ``metrics.csv`` as floats (None where a value was not measured)."""
    with Path(path).open() as f:
        return [
            {k: float(v) if v != "" else None for k, v in row.items()} for row in csv.DictReader(f)
        ]


def write_summary(path: Path, rows: list[dict], status: str = "finished", **totals) -> dict:
    """``summary.json`` from the metrics rows plus the run's totals (params, phase times, ETL
    manifest). The final figures are the last evaluation's, and only for a run that finished: a
    diverged run has none."""
    val = [
        r["val_loss"] for r in rows
        if r.get("val_loss") is not None and math.isfinite(r["val_loss"])
    ]
    last = rows[-1] if rows and status == "finished" else {}
    summary = {
        "status": status,
        "final_val_loss": last.get("val_loss"),
        "best_val_loss": min(val) if val else None,
        "first_val_loss": val[0] if val else None,
        "final_val_bpc": last.get("val_bpc"),
        "final_val_acc": last.get("val_acc"),
        **_dpo_finals(last),
        **_grpo_finals(rows, last),
        "final_train_loss": last.get("train_loss"),
        "steps": int(rows[-1]["step"]) if rows else 0,
        "tokens": int(rows[-1]["tokens"]) if rows else 0,
        "tokens_per_s": (rows[-1]["tokens"] / rows[-1]["elapsed_s"])
        if rows and rows[-1]["elapsed_s"]
        else None,
        # in the epoch of the last evaluation, the most any worker read (its share: windows/W)
        "windows_read_per_worker": rows[-1].get("windows_read") if rows else None,
        "chunks_read_per_worker": rows[-1].get("chunks_read") if rows else None,
        **totals,
    }
    Path(path).write_text(json.dumps(summary, indent=2))
    return summary


def _grpo_finals(rows: list[dict], last: dict) -> dict:
    """A GRPO run's rewards: its first and last evaluations' on the held-out prompts, and the
    last interval's on its own answers; nothing for other runs."""
    if "reward_mean" not in last:
        return {}
    val = [r["val_reward"] for r in rows if r.get("val_reward") is not None]
    return {"first_val_reward": val[0] if val else None, "final_val_reward": last.get("val_reward"),
            "final_reward_mean": last.get("reward_mean")}


def _dpo_finals(last: dict) -> dict:
    """A DPO run's last evaluation: its reward accuracy and margin (its loss is final_val_loss);
    nothing for a language-modelling run."""
    if last.get("val_reward_margin") is None:
        return {}
    return {"final_val_reward_accuracy": last.get("val_acc"),
            "final_val_reward_margin": last.get("val_reward_margin")}
