"""The controller's metrics writer: metrics.csv and TensorBoard's scalars, written without torch,
and a restarted group's repeated steps replacing the earlier attempt's in both."""

from __future__ import annotations

import subprocess
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from raydp_llm.training.driver.metrics import MetricsWriter, read_metrics


def report(writer: MetricsWriter, step: int, loss: float) -> None:
    writer.after_report(None, [{"step": step, "train_loss": loss, "val_loss": loss + 1}], None)


def test_a_restarts_repeated_steps_replace_the_earlier_points(tmp_path):
    writer = MetricsWriter(tmp_path)
    for step, loss in [(10, 3.0), (20, 2.5), (30, 2.0)]:
        report(writer, step, loss)
    for step, loss in [(20, 2.4), (30, 1.9), (40, 1.5)]:  # the group restarted from step 10
        report(writer, step, loss)
    writer._events.close()

    rows = read_metrics(tmp_path / "metrics.csv")
    assert [(r["step"], r["train_loss"]) for r in rows] == [(10, 3.0), (20, 2.4), (30, 1.9),
                                                            (40, 1.5)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    shown = [(e.step, round(e.value, 4)) for e in events.Scalars("train_loss")]
    assert shown == [(10, 3.0), (20, 2.4), (30, 1.9), (40, 1.5)]
    assert [e.step for e in events.Scalars("val_loss")] == [10, 20, 30, 40]


# What Ray Train's controller unpickles of a run: the callbacks, the backend, the loop's config
CONTROLLER_SIDE = ["driver.metrics", "driver.best", "handoff"]


def test_the_controller_side_imports_no_torch(tmp_path):
    """The controller starts the workers only once it has imported these (torch: about 3 s of CPU
    on 2 cores, the whole loop's imports about 5 s), and writes the metrics while they train."""
    code = "; ".join([
        "import sys",
        "from pathlib import Path",
        *[f"import raydp_llm.training.{name}" for name in CONTROLLER_SIDE],
        "from raydp_llm.training.driver.metrics import MetricsWriter",
        f"w = MetricsWriter(Path({str(tmp_path)!r}))",
        "w.after_report(None, [{'step': 1, 'train_loss': 1.0}], None)",
        "loop = 'raydp_llm.training.worker.loop'",
        "print(sorted(m for m in sys.modules if m == 'torch' or m == loop))",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "tensorboard").is_dir()


def test_restarts_and_resizes_are_events_and_a_last_failure_is_none(tmp_path):
    """A failed group restarts from the last checkpoint while max_failures allows (the lost
    workers named); a report from another number of workers with no failure between is a resize;
    the failure beyond max_failures ends the run and is no restart."""
    from ray.exceptions import ActorDiedError

    from raydp_llm.training.driver.metrics import read_events

    writer = MetricsWriter(tmp_path, max_failures=1)
    writer.after_report(None, [{"step": 10, "train_loss": 3.0}] * 2, _Checkpoint("ckpt-10"))
    writer.after_exception(None, {1: ActorDiedError(), 0: RuntimeError("collective aborted")})
    writer.after_report(None, [{"step": 20, "train_loss": 2.0}], None)  # restarted on 1 worker
    writer.after_report(None, [{"step": 30, "train_loss": 1.0}] * 2, None)  # grown to 2
    writer.after_exception(None, {0: ActorDiedError()})  # the second failure: the run fails
    writer._events.close()

    events = read_events(tmp_path)
    assert [(e["event"], e["from_step"]) for e in events] == [("restart", 10), ("resize", 10)]
    assert events[0]["lost"] == [1] and "collective aborted" in events[0]["errors"]["0"]
    assert events[1]["workers"] == 2


class _Checkpoint:
    def __init__(self, path: str):
        self.path = path
