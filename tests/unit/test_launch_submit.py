"""The client scripts that work with a running cluster (launch/submit.sh, tunnel.sh, teardown.sh):
the exact commands of every dry run, and the cluster's token found, passed and removed. Nothing
here calls AWS, SSH or Ray: stand-ins for `aws`, `ssh` and `ray` on PATH (the `env` fixture)
record any call, and the tests assert there was none."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from pathlib import Path

from helpers.launch import SUBMIT, TEARDOWN, TUNNEL, lines, run

SSH_OPTS = ("-N -L 8265:127.0.0.1:8265 -o ExitOnForwardFailure=yes -o ServerAliveInterval=30 "
            "-o StrictHostKeyChecking=accept-new")


# --- submit.sh, tunnel.sh, teardown.sh
# -----------------------------------------------------------------------

def test_submit_dry_run_with_tunnel(env):
    p = run(
        SUBMIT,
        "--dry-run",
        "--head",
        "ec2-1-2-3-4.compute.amazonaws.com",
        "--key",
        "key.pem",
        "--",
        "data.path=s3://bucket/corpus/",
        "train.num_workers=4",
        "sample.prompt=To be",
        env=env,
    )
    sock = f"{env['HOME']}/.ssh/raydp_llm-tunnel-8265"
    assert lines(p) == [
        f"ssh -f -M -S {sock} -i key.pem {SSH_OPTS} hadoop@ec2-1-2-3-4.compute.amazonaws.com",
        "env RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 -- python -m "
        "raydp_llm.train +experiment=emr data.path=s3://bucket/corpus/ train.num_workers=4 "
        "'sample.prompt=To be'",
        f"ssh -S {sock} -O exit raydp_llm-tunnel",
    ]


def test_submit_dry_run_through_open_tunnel(env):
    p = run(
        SUBMIT,
        "--dry-run",
        "--port",
        "18265",
        "--experiment",
        "smoke",
        "--submission-id",
        "run-1",
        "--no-wait",
        env=env,
    )
    assert lines(p) == [
        "env RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:18265 --submission-id "
        "run-1 --no-wait -- python -m raydp_llm.train +experiment=smoke",
    ]


def test_submit_as_an_emr_step_hands_the_run_the_words_typed(env, tmp_path):
    """--emr-step: one `aws emr add-steps` for the recorded cluster (no ssh, no tunnel, no token
    here); the step's command, run by bash on a stand-in primary, gives the run's Python exactly
    the overrides typed, quotes, $(...) and [a,b] among them."""
    record = Path(env["HOME"]) / ".ray" / "raydp_llm" / "clusters" / "c1"
    record.mkdir(parents=True)
    (record / "cluster.env").write_text("CLUSTER_ID=j-1ABC\nTOKEN_URI=s3://b/t\n")
    typed = ["data.path=s3://b/corpus/", "sample.prompt=To be, or 'not'", "x=$(touch pwned)",
             "train.x=[a,b]"]
    app = tmp_path / "app"
    p = run(SUBMIT, "--emr-step", "--dry-run", "--app-dir", str(app), "--region", "eu-west-1",
            "--", *typed, env=env)
    [line] = lines(p)
    words = shlex.split(line)
    assert words[:5] == ["aws", "emr", "add-steps", "--cluster-id", "j-1ABC"]
    assert words[5] == "--steps" and words[7:] == ["--query", "StepIds[0]", "--output", "text",
                                                   "--region", "eu-west-1"]
    [step] = json.loads(words[6])
    assert step["Jar"] == "command-runner.jar" and step["Args"][:2] == ["bash", "-c"]

    # the primary: the venv's python a stand-in that prints its words, HOME the step's directory
    (app / "venv" / "bin").mkdir(parents=True)
    python = app / "venv" / "bin" / "python"
    python.write_text('#!/bin/sh\necho "$RAY_AUTH_MODE"; printf "%s\\n" "$@"\n')
    python.chmod(0o755)
    primary = tmp_path / "primary"
    primary.mkdir()
    out = subprocess.run(["bash", "-c", step["Args"][2]], env={**env, "HOME": str(primary)},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["token", "-m", "raydp_llm.train", "+experiment=emr", *typed]
    assert list(primary.iterdir()) == []  # $(touch pwned) stayed a word


def test_submit_passes_token_in_environment(env, tmp_path):
    """Not a dry run: `ray` (the stand-in) gets RAY_AUTH_MODE=token and the token from the token
    file."""
    token = tmp_path / "token"
    token.write_text("0123abcd")
    fake_ray = Path(env["PATH"].split(os.pathsep)[0]) / "ray"
    fake_ray.write_text('#!/bin/sh\necho "$RAY_AUTH_MODE $RAY_AUTH_TOKEN $*" > '
                        f'"{tmp_path}/ray-args"\n')
    p = run(SUBMIT, "--token-file", str(token), "--", "train.max_steps=10", env=env)
    assert p.stdout == ""
    assert (tmp_path / "ray-args").read_text() == (
        "token 0123abcd job submit --address http://127.0.0.1:8265 -- python -m raydp_llm.train "
        "+experiment=emr train.max_steps=10\n")


def test_submit_finds_the_clusters_token(env, tmp_path):
    fake_ray = Path(env["PATH"].split(os.pathsep)[0]) / "ray"
    fake_ray.write_text(f'#!/bin/sh\necho "$RAY_AUTH_TOKEN" > "{tmp_path}/ray-token"\n')
    clusters = tmp_path / "home" / ".ray" / "raydp_llm" / "clusters"
    for name in ("a", "b"):
        (clusters / name).mkdir(parents=True)
        (clusters / name / "auth_token").write_text(f"token-{name}")
    assert "several clusters" in run(SUBMIT, env=env, check_rc=2).stderr
    run(SUBMIT, "--cluster", "b", env=env)
    assert (tmp_path / "ray-token").read_text() == "token-b\n"
    (clusters / "b" / "auth_token").unlink()
    run(SUBMIT, env=env)  # the only one left
    assert (tmp_path / "ray-token").read_text() == "token-a\n"


def test_tunnel_dry_runs(env):
    sock = f"{env['HOME']}/.ssh/raydp_llm-tunnel-9000"
    assert lines(run(TUNNEL, "--dry-run", "--head", "h.example", "--key", "k.pem", env=env)) == [
        f"ssh -i k.pem {SSH_OPTS} hadoop@h.example"]
    assert lines(
        run(
            TUNNEL,
            "--dry-run",
            "--head",
            "h.example",
            "--key",
            "k.pem",
            "--user",
            "ec2-user",
            "--port",
            "9000",
            "--background",
            env=env,
        )
    ) == [
        f"ssh -f -M -S {sock} -i k.pem " + SSH_OPTS.replace("8265", "9000") + " ec2-user@h.example"
    ]
    assert lines(run(TUNNEL, "--dry-run", "--stop", "--port", "9000", env=env)) == [
        f"ssh -S {sock} -O exit raydp_llm-tunnel"]


def test_teardown_dry_runs(env, tmp_path):
    assert lines(run(TEARDOWN, "--dry-run", "--cluster-id", "j-2AXXXXXXGAPLF", env=env)) == [
        "aws emr terminate-clusters --cluster-ids j-2AXXXXXXGAPLF"]
    assert lines(
        run(
            TEARDOWN,
            "--dry-run",
            "--cluster-id",
            "j-2AXXXXXXGAPLF",
            "--region",
            "us-west-2",
            "--wait",
            env=env,
        )
    ) == [
        "aws emr terminate-clusters --cluster-ids j-2AXXXXXXGAPLF --region us-west-2",
        "aws emr wait cluster-terminated --cluster-id j-2AXXXXXXGAPLF --region us-west-2",
    ]
    assert lines(
        run(TEARDOWN, "--dry-run", "--ray-config", "launch/ray/cluster.yaml", env=env)
    ) == ["ray down -y launch/ray/cluster.yaml"]
    # An open background tunnel (its control socket) is closed first.
    ssh_dir = tmp_path / "home" / ".ssh"
    ssh_dir.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ssh_dir / "raydp_llm-tunnel-8265"))
    try:
        assert lines(run(TEARDOWN, "--dry-run", "--cluster-id", "j-2AXXXXXXGAPLF", env=env)) == [
            f"ssh -S {ssh_dir}/raydp_llm-tunnel-8265 -O exit raydp_llm-tunnel",
            "aws emr terminate-clusters --cluster-ids j-2AXXXXXXGAPLF"]
    finally:
        sock.close()


def test_teardown_removes_the_clusters_token(env, tmp_path):
    record = tmp_path / "home" / ".ray" / "raydp_llm" / "clusters" / "x"
    record.mkdir(parents=True)
    (record / "auth_token").write_text("secret")
    (record / "cluster.env").write_text(
        "CLUSTER_ID=j-2AXXXXXXGAPLF\n"
        "TOKEN_URI=s3://b/p/clusters/x/auth_token\n"
        f"TOKEN_FILE={record}/auth_token\n"
    )
    assert lines(run(TEARDOWN, "--dry-run", "--cluster-id", "j-2AXXXXXXGAPLF", env=env)) == [
        "aws emr terminate-clusters --cluster-ids j-2AXXXXXXGAPLF",
        "aws s3 rm --only-show-errors s3://b/p/clusters/x/auth_token",
        f"rm -f {record}/auth_token {record}/cluster.env"]
    p = run(TEARDOWN, "--dry-run", "--cluster-id", "j-OTHERCLUSTER", env=env)
    assert "no record of j-OTHERCLUSTER" in p.stderr and "remove its token by hand" in p.stderr

