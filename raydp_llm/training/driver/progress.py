"""The live console display on the driver: a tqdm bar over the ETL's phases, then one over the
training steps (loss, validation loss, tokens/s, ETA) with a concise line per evaluation.

Training runs in Ray Train workers: rank 0 posts its step to the run's board (the hand-off actor,
handoff.py's ``LivePosts``) every half second, and ``TrainingProgress`` (a thread on the driver)
reads it, the new rows of ``metrics.csv`` and the restarts the controller records
(``events.jsonl``), a line each. Log lines go through tqdm (``logging_redirect_tqdm``), so they
never tear the bar.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import ray
from tqdm import tqdm

from raydp_llm.core.console import console_bar
from raydp_llm.training.driver.metrics import METRICS_FILE, read_events, read_metrics, source_losses


class TrainingProgress(threading.Thread):
    """Follows a training run on the driver: the bar from the board, a line per new ``metrics.csv``
    row and per restart of the worker group."""

    def __init__(
        self, board, out_dir: Path, max_steps: int, max_failures: int, interval_s: float = 0.5,
        on_row: Callable[[dict], None] | None = None,
    ):
        super().__init__(daemon=True)
        self.on_row = on_row  # told each new row too (experiment tracking)
        self.board, self.out_dir, self.max_steps, self.interval_s = (
            board,
            Path(out_dir),
            max_steps,
            interval_s,
        )
        self.max_failures = max_failures
        self._done, self._step, self._events, self._val = threading.Event(), 0, 0, None
        self._bar_cm = console_bar(max_steps, "train", "step")

    def run(self) -> None:
        with self._bar_cm as bar:
            while not self._done.wait(self.interval_s):
                self._refresh(bar)
            self._refresh(bar)

    def _refresh(self, bar: tqdm) -> None:
        self._report_events(bar)
        path = self.out_dir / METRICS_FILE
        for row in read_metrics(path) if path.exists() else []:
            if (
                row["step"] <= self._step
            ):  # shown already (a restart reports steps again: shown once)
                continue
            self._step, self._val = row["step"], row.get("val_reward", row.get("val_loss"))
            if self.on_row:
                self.on_row(row)
            bar.write(row_line(row, self.max_steps))
            bar.update(
                max(0, int(row["step"]) - bar.n)
            )  # the last steps may come after the last post
        try:
            latest = ray.get(self.board.read.remote(), timeout=5)
        except (ray.exceptions.RayError, TimeoutError):  # the run is ending: keep the last figures
            return
        if latest:
            bar.update(max(0, latest["step"] - bar.n))
            bar.set_postfix_str(postfix(latest, self._val), refresh=False)

    def _report_events(self, bar: tqdm) -> None:
        events = read_events(self.out_dir)
        for i, event in enumerate(events[self._events:], start=self._events):
            restarts = sum(1 for e in events[:i + 1] if e["event"] == "restart")
            bar.write(event_line(event, restarts, self.max_failures))
        self._events = len(events)

    def stop(self) -> None:
        self._done.set()
        self.join()


def postfix(latest: dict, val: float | None) -> str:
    """The live bar's figures: rank 0's latest post and the last evaluation's ``val``: the loss,
    or a GRPO run's step reward (its loss hovers at 0) and validation reward."""
    if "reward" in latest:
        head, label = f"reward {latest['reward']:.3f} ± {latest['reward_std']:.3f}", "val reward"
    else:
        head, label = f"loss {latest['loss']:.3f}", "val"
    shown = f", {label} {val:.3f}" if val is not None else ""
    return f"{head}{shown}, {latest['tokens_per_s']:,.0f} tok/s"


def row_line(row: dict, max_steps: int) -> str:
    """The console line of an evaluation: the losses (each source's), or a GRPO run's rewards."""
    head = f"step {row['step']:.0f}/{max_steps}"
    if row.get("reward_mean") is not None:
        val = row.get("val_reward")
        return (f"{head} | reward {row['reward_mean']:.4f} ± {row['reward_std']:.4f} | val reward "
                f"{'n/a' if val is None else f'{val:.4f}'} | answers "
                f"{row['completion_len_mean']:.1f} tokens | {row['tokens_per_s']:,.0f} tok/s")
    per_source = ", ".join(f"{name} {loss:.4f}" for name, loss in source_losses(row).items())
    sources = f" ({per_source})" if per_source else ""
    return (f"{head} | train loss {row['train_loss']:.4f} | val loss {row['val_loss']:.4f}"
            f"{sources} | val acc {row['val_acc']:.3f} | {row['tokens_per_s']:,.0f} tok/s")


def event_line(event: dict, restarts: int, max_failures: int) -> str:
    """The console line of a restart or an elastic resize (``metrics.MetricsWriter``'s events)."""
    where = (f"the checkpoint at step {event['from_step']}" if event["from_step"] is not None
             else "the run's starting point")
    if event["event"] == "resize":
        return (
            f"elastic: the worker group becomes {event['workers']} workers, going on from {where}"
        )
    lost, errors = event["lost"], event["errors"]
    if lost:
        workers = f"worker{'s' * (len(lost) > 1)} {', '.join(map(str, lost))}"
        failed = f"{workers} lost ({errors[str(lost[0])]})"
    else:
        failed = "; ".join(f"worker {rank}: {what}" for rank, what in errors.items())
    limit = f" of at most {max_failures}" if max_failures >= 0 else ""
    return f"restart {restarts}{limit}: {failed}; going on from {where}"
