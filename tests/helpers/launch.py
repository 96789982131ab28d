"""The launch scripts (launch/) run as a user runs them, in an environment whose ``aws``, ``ssh``
and ``ray`` are stand-ins (the ``env`` fixture, tests/fixtures/launch.py):
tests/unit/test_launch.py and tests/unit/test_launch_submit.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers.paths import LAUNCH

BOOTSTRAP = LAUNCH / "emr" / "bootstrap.sh"
CREATE = LAUNCH / "emr" / "create_cluster.sh"
SUBMIT = LAUNCH / "submit.sh"
TUNNEL = LAUNCH / "tunnel.sh"
TEARDOWN = LAUNCH / "teardown.sh"
WHEELHOUSE = LAUNCH / "emr" / "wheelhouse.sh"


def run(
    script: Path, *args: str, env: dict, check_rc: int | None = 0
) -> subprocess.CompletedProcess:
    """``bash script args`` in ``env``; asserts its exit status is ``check_rc`` (None: any)."""
    p = subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=60
    )
    if check_rc is not None:
        assert p.returncode == check_rc, (
            f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        )
    return p


def lines(p: subprocess.CompletedProcess) -> list[str]:
    """The lines a script printed (a dry run: one command a line)."""
    return p.stdout.splitlines()
