"""The cluster's surface: the Ray token file readable by its owner alone, and Hydra overrides that
reach the job on the head node word for word through `ray job submit` and the head's shell
(launch/submit.sh)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import commands
from helpers.paths import ROOT
from raydp_llm.engines.ray_cluster import secure_token_file

SUBMIT = ROOT / "launch" / "submit.sh"


def test_the_embedded_rays_token_file_is_private(tmp_path):
    """Ray 2.60 writes ~/.ray/auth_token 0644; the embedded Ray's start leaves it 0600 (fresh HOME,
    real Ray)."""
    home = tmp_path / "home"
    home.mkdir()
    code = ("import sys; sys.path.insert(0, 'tests'); from helpers.configs import make_config; "
            "from raydp_llm.engines.ray_cluster import ray_session; import ray\n"
            "with ray_session(make_config('cluster.dashboard=false').cluster, 'token'):\n"
            "    assert ray.is_initialized()")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=os.environ | {"HOME": str(home)},
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    token = home / ".ray" / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and (home / ".ray").stat().st_mode & 0o077 == 0
    assert len(token.read_text().strip()) >= 32


def test_an_existing_token_file_is_made_private(tmp_path):
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("a" * 64)
    token.chmod(0o644)
    secure_token_file(token)
    assert token.stat().st_mode & 0o777 == 0o600 and token.read_text() == "a" * 64
    fresh = tmp_path / "other" / "auth_token"
    secure_token_file(fresh)
    assert fresh.stat().st_mode & 0o777 == 0o600 and fresh.read_text() != token.read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head_node(tmp_path):
    """A Ray head of its own with its dashboard, as on a cluster's head node (the tests' Ray runs
    none): ``ray start --head --block``, stopped at the end; its dashboard's port."""
    port = free_port()
    temp = Path(tempfile.mkdtemp(prefix="rayhead_", dir="/tmp"))  # short: Ray's socket paths
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
         f"--port={free_port()}", f"--dashboard-port={port}", "--dashboard-host=127.0.0.1",
         "--include-dashboard=true", "--num-cpus=1", f"--temp-dir={temp}", "--disable-usage-stats",
         # the agent's ports of its own: the tests' Ray's agent holds the defaults
         f"--dashboard-agent-listen-port={free_port()}",
         f"--dashboard-agent-grpc-port={free_port()}", f"--metrics-export-port={free_port()}",
         f"--runtime-env-agent-port={free_port()}"],
        env=commands.USER_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not _answers(f"http://127.0.0.1:{port}/api/version"):
        assert head.poll() is None and time.time() < deadline, "the Ray head did not start"
        time.sleep(0.5)
    yield port
    head.terminate()  # --block: the head stops what it started
    head.wait(timeout=60)
    shutil.rmtree(temp, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except urllib.error.HTTPError:
        return True  # it answered (behind its token)
    except OSError:
        return False
    return True


@pytest.mark.integration
def test_submit_passes_overrides_to_the_job_word_for_word(head_node, tmp_path):
    """launch/submit.sh against a real Ray dashboard: `ray job submit` hands the entrypoint to a
    shell on the head; a stand-in `python` there (first on the job's PATH) records the words it
    gets. Quotes, $(...), backquotes, [a,b] and runs of spaces arrive as typed, and nothing is run
    by the shell."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "python").write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import json, os, sys; "
                                 "json.dump(sys.argv[1:], open(os.environ[\"ARGV_OUT\"], \"w\"))' "
                                 "\"$@\"\n")
    (stub / "python").chmod(0o755)
    pwned, argv_out = tmp_path / "PWNED", tmp_path / "argv.json"
    typed = [
        "sample.prompt=ROMEO's",
        f"x=$(touch {pwned})",
        f"y=`touch {pwned}`",
        "data.path=[a,b]",
        "z=two  spaces",
        'q="quoted"',
        "b=back\\slash",
        "sample.prompt=ROMEO:\n",
    ]
    runtime_env = {"env_vars": {"PATH": f"{stub}:{os.environ['PATH']}", "ARGV_OUT": str(argv_out)}}
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                        "RAY_AUTH_TOKEN": (Path.home() / ".ray" / "auth_token").read_text().strip()}
    command = ["bash", str(SUBMIT), "--port", str(head_node), "--runtime-env-json",
               json.dumps(runtime_env), "--", *typed]
    for _ in range(30):  # the head's job agent registers a while after its dashboard answers
        p = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        if "No available agent to submit job" not in p.stdout + p.stderr:
            break
        time.sleep(2)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert json.loads(argv_out.read_text()) == ["-m", "raydp_llm.train", "+experiment=emr", *typed]
    assert not pwned.exists()
