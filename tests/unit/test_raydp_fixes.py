"""The workarounds of Ray's and RayDP's bugs were read against the versions installed: another
version may have fixed a bug, or moved what a workaround reaches into."""

from __future__ import annotations

from importlib.metadata import version

from raydp_llm.engines.raydp_fixes import READ_AGAINST


def test_the_workarounds_were_read_against_the_installed_ray_and_raydp():
    installed = {name: version(name) for name in READ_AGAINST}
    assert installed == READ_AGAINST, (
        "read each workaround in raydp_llm/engines/raydp_fixes.py against the installed versions, "
        "then update READ_AGAINST"
    )
