"""`make test`: pytest, as a relay of processes. A pytest process that has run ``PROCESS_FOR_S``
(tests/fixtures/budget.py) ends at the next module boundary and a fresh one goes on from the next
test, with the same arguments; one ended by the watchdog (a hung test) is followed the same way.

Why: the suite's embedded Ray lives in the pytest process, and on Ray 2.60 a driver that lived past
20 minutes, or that had stopped and started its Ray in the same process, stopped hearing from its
GCS (engines/raydp_fixes.py, 7; docs/reliability.md). A fresh process is a fresh driver.

    python tests/suite.py [pytest's arguments]   # ``python -m pytest`` alone runs one process

Each process prints its own report; the last lines are the relay's: each process's tests,
failures and minutes, and the exit status (0 only when every process passed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# what tests/fixtures/budget.py reads: where a process writes what it ran, when the suite began
EVENTS_ENV, BEGAN_ENV = "RAYDP_LLM_SUITE_EVENTS", "RAYDP_LLM_SUITE_BEGAN"
NO_TESTS = 5  # pytest's exit status when nothing was left to run


@dataclass
class Leg:
    """One pytest process of the relay, as its events tell it."""

    status: int
    ran: int = 0
    failed: int = 0
    handed_on: bool = False  # ended itself at a module boundary (budget.py's relay)
    hung: str = ""  # the test the watchdog ended it on
    minutes: float = 0.0

    @property
    def passed(self) -> bool:
        if self.hung or self.failed:
            return False
        # a hand-over ends pytest as "interrupted" (2); a last leg may find nothing left (5)
        return self.status == 0 or (self.handed_on and self.status == 2) or (
            self.status == NO_TESTS and self.ran == 0)

    @property
    def goes_on(self) -> bool:
        return self.handed_on or bool(self.hung)


def main(args: list[str]) -> int:
    events = Path(tempfile.mkdtemp(prefix="raydp_llm_suite_")) / "events.jsonl"
    env = os.environ | {EVENTS_ENV: str(events), BEGAN_ENV: str(time.time())}
    legs: list[Leg] = []
    while not legs or legs[-1].goes_on:
        began, seen = time.monotonic(), _count(events)
        status = subprocess.run([sys.executable, "-m", "pytest", *args], env=env).returncode
        legs.append(_leg(status, _read(events)[seen:], (time.monotonic() - began) / 60))
    _report(legs)
    if all(leg.passed for leg in legs):
        return 0
    return next((leg.status for leg in legs if not leg.passed and leg.status not in (0, 2)), 1)


def _leg(status: int, events: list[dict], minutes: float) -> Leg:
    leg = Leg(status, minutes=minutes)
    for event in events:
        leg.ran += "ran" in event
        leg.failed += event.get("failed", False)
        leg.handed_on |= "handed_on" in event
        leg.hung = event.get("hung", leg.hung)
    return leg


def _report(legs: list[Leg]) -> None:
    if len(legs) == 1:
        return  # one process: its own report is the suite's
    print("\n[suite] the relay of pytest processes (tests/suite.py):")
    for number, leg in enumerate(legs, 1):
        print(f"[suite]   {number}: {leg.ran} tests, {leg.failed} failed, {leg.minutes:.1f} min, "
              f"{_ended(leg)}")
    failed = sum(leg.failed for leg in legs)
    print(f"[suite] {sum(leg.ran for leg in legs)} tests, {failed} failed, in "
          f"{sum(leg.minutes for leg in legs):.1f} min", flush=True)


def _ended(leg: Leg) -> str:
    if leg.hung:
        return f"ended by the watchdog on {leg.hung}"
    if leg.handed_on:
        return "handed on at a module boundary"
    return f"exit status {leg.status}"


def _read(events: Path) -> list[dict]:
    if not events.is_file():
        return []
    return [json.loads(line) for line in events.read_text().splitlines() if line.strip()]


def _count(events: Path) -> int:
    return len(_read(events))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
