"""The console's live bars (tqdm on stderr), with log lines routed around them so that they never
tear a bar."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

BAR_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar:24}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
)


@contextlib.contextmanager
def console_bar(total: int, desc: str, unit: str) -> Iterator[tqdm]:
    """A tqdm bar on stderr with the log lines routed around it."""
    with (
        logging_redirect_tqdm(),
        tqdm(
            total=total,
            desc=desc,
            unit=unit,
            file=sys.stderr,
            bar_format=BAR_FORMAT,
            dynamic_ncols=True,
            mininterval=0.5,
        ) as bar,
    ):
        yield bar


class PhaseBar:
    """The ETL's phases on a bar: each ``done(phase, seconds)`` moves it on and names what
    finished."""

    def __init__(self, bar: tqdm):
        self.bar = bar

    def done(self, phase: str, seconds: float) -> None:
        self.bar.set_postfix_str(f"{phase} {seconds:.1f}s", refresh=False)
        self.bar.update()
