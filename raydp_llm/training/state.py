"""Where a run stands: the training state a checkpoint keeps as ``train_state.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class TrainState:
    """The step, the epoch and the step within it, and the training seconds so far; in a
    checkpoint also the run's fingerprint, ``max_steps`` and number of workers (which
    ``runs.find_resumable`` reads). ``to_json`` keeps the keys and values of ``train_state.json``
    as they always were, so that any earlier checkpoint loads."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    elapsed_s: float = 0.0
    fingerprint: str | None = None  # the fields below: set when a checkpoint is written
    max_steps: int | None = None
    world: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, saved: dict) -> TrainState:
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})
