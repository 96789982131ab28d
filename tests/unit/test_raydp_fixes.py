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


def test_pyspark_still_runs_python_in_the_fork_that_launches_its_gateway():
    """Workaround 7's cause, as PySpark 3.5.7 has it: its gateway's ``Popen`` runs a Python
    function in the forked driver. When this fails, PySpark no longer does: drop the workaround."""
    import inspect

    from pyspark import java_gateway

    assert 'popen_kwargs["preexec_fn"] = preexec_func' in inspect.getsource(
        java_gateway.launch_gateway)


def test_while_spark_starts_the_gateway_runs_no_python_in_the_fork(tmp_path):
    """Workaround 7: the ``preexec_fn`` PySpark passes never runs (it would write a file); the
    process runs in a process group of its own, which a terminal's Ctrl-C does not reach."""
    import os
    import subprocess
    import sys

    from pyspark import java_gateway

    from raydp_llm.engines.raydp_fixes import gateway_without_preexec

    ran = tmp_path / "preexec_ran"
    with gateway_without_preexec():
        proc = java_gateway.Popen([sys.executable, "-c", "import os; print(os.getpgid(0))"],
                                  stdout=subprocess.PIPE, text=True,
                                  preexec_fn=lambda: ran.write_text("ran"))
    out = proc.communicate(timeout=60)[0]
    assert not ran.exists()
    assert int(out) == proc.pid != os.getpgid(0)
    assert java_gateway.Popen is subprocess.Popen  # put back
