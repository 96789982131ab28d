"""What a chat, preference or prompts run's data left out, and why: the encoder's counts
(manifest.json's ``chat``) as reasons, each with the setting that keeps those rows. A run never
drops rows without saying so: the console, manifest.json and summary.json say it (``LeftOut``),
and a run that would leave out more than ``data.max_dropped`` of its conversations, pairs or
prompts stops with one line (``refused``) before it trains."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from raydp_llm.core.errors import InputError

log = logging.getLogger(__name__)

# reason (the encoder's count) -> what the rows were, and what keeps them
WHY = {
    "dropped": ("longer than model.block_size + 1 = {record} tokens",
                "raise model.block_size, or set data.overlong=truncate"),
    "no_assistant": ("with no assistant turn to train on", "set data.train_on=all"),
    "incomplete": ("without both answers", "give each row a chosen and a rejected answer"),
    "identical": ("whose two answers are the same", "give each row two different answers"),
    # prompts (data.format=prompts): record is the most tokens a prompt keeps
    "too_long": ("longer than model.block_size - grpo.max_new_tokens = {record} tokens",
                 "raise model.block_size, lower grpo.max_new_tokens, or set "
                 "data.overlong=truncate"),
    "no_prompt": ("with no prompt", "name its column with data.prompt_column or "
                                    "data.messages_column"),
    "not_json": ("that are not a JSON object", "fix those rows"),
}
UNITS = ("pairs", "prompts", "conversations")  # the first a manifest's entry counts


@dataclass(frozen=True)
class LeftOut:
    """The rows read (conversations or pairs), those kept, and those left out by reason."""

    unit: str  # conversations | pairs | prompts
    read: int
    kept: int
    reasons: dict[str, int]
    record: int  # model.block_size + 1

    @classmethod
    def of(cls, chat: dict | None) -> LeftOut | None:
        """From a manifest's ``chat`` entry; None for other data (nothing is dropped)."""
        if not chat:
            return None
        unit = next(u for u in UNITS if u in chat)
        reasons = {why: int(chat.get(why, 0)) for why in WHY if chat.get(why)}
        return cls(unit, chat[unit] + sum(reasons.values()), chat[unit], reasons,
                   int(chat["record_tokens"]))

    @property
    def count(self) -> int:
        return self.read - self.kept

    def to_json(self) -> dict:
        return {"unit": self.unit, "read": self.read, "kept": self.kept, "left_out": self.reasons}

    def why(self) -> str:
        """``3 longer than ... (raise model.block_size, ...); 1 with no ...``: each reason's rows
        and what keeps them."""
        return "; ".join(f"{n} {WHY[why][0].format(record=self.record)} ({WHY[why][1]})"
                         for why, n in self.reasons.items())

    def line(self) -> str:
        """``left out 3 of 40 pairs: 3 longer than ... (raise model.block_size, ...)``."""
        return f"left out {self.count} of {self.read} {self.unit}: {self.why()}"

    def refused(self, max_share: float) -> InputError | None:
        """The one line when more than ``max_share`` of the rows would be left out, else None."""
        if self.read and self.count > max_share * self.read:
            return InputError(f"data: the run would leave out {self.count} of {self.read} "
                             f"{self.unit} ({self.count / self.read:.0%}, more than "
                             f"data.max_dropped={max_share:g}): {self.why()}; "
                             "or set data.max_dropped=1 to train on the rest")


def said(chat: dict | None, max_share: float) -> InputError | None:
    """What the data of a manifest's ``chat`` entry left out, on the console (a warning, when any
    row was); the one line that stops the run when more than ``max_share`` of them were."""
    left = LeftOut.of(chat)
    if left is None:
        return None
    if left.count:
        log.warning("%s", left.line())
    return left.refused(max_share)
