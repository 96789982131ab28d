"""An entry point started as from a terminal, and waiting for the moment a test acts on (a file, a
log line), failing when the moment never comes rather than acting anyway."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Callable

from helpers.paths import ROOT


def start_like_a_terminal(module: str, *args: str) -> subprocess.Popen:
    """``python -m module args`` with SIGINT at its default, as a terminal's Ctrl-C would find it (a
    runner started in the background, ``cmd &``, ignores SIGINT, and the child would inherit
    that). Not with a ``preexec_fn``: Python run in a fork of this process, a Ray driver, can act
    on its Ray connections (raydp_fixes.py, 7); a handled SIGINT is reset to its default by exec
    itself, so while the child starts this process handles SIGINT (from its main thread)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def wait_for(proc: subprocess.Popen, ready: Callable[[], bool], what: str,
             timeout_s: float) -> float:
    """Wait until ``ready()`` while ``proc`` runs; the seconds it took. Fails the test (with the
    process's last output) when ``proc`` ends first or ``timeout_s`` passes: then ``what`` never
    came, and acting anyway would test another moment."""
    start = time.time()
    while not ready():
        if proc.poll() is not None:
            output = proc.communicate()[0] or ""
            raise AssertionError(f"{what} never came: the process ended with {proc.returncode}\n"
                                 f"{output[-3000:]}")
        if time.time() - start > timeout_s:
            proc.kill()
            output = proc.communicate()[0] or ""
            raise AssertionError(f"{what} never came in {timeout_s:g} s\n{output[-3000:]}")
        time.sleep(0.2)
    return time.time() - start
