"""Spark's protections as settings (raydp_llm/engines/spark_security.py): on by default, off only by
the user's word with a warning, the secret never among the settings RayDP is given; its credentials
file. That Spark and Hadoop take them: tests/integration/test_multinode.py (a wrong secret refused)
and test_monitoring.py (no secret written anywhere)."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from helpers.configs import make_config
from helpers.exposure import is_loopback, spark_secret_of
from raydp_llm.core.checks import validate
from raydp_llm.core.config import ClusterSettings
from raydp_llm.core.errors import InputError
from raydp_llm.engines import spark_security
from raydp_llm.engines.ray_cluster import init_options, node_address
from raydp_llm.engines.raydp_fixes import SINGLE_MACHINE
from raydp_llm.engines.spark_security import SECRET, credentials, reap_stale, secret_dir
from raydp_llm.engines.spark_settings import spark_configs


def test_spark_authenticates_and_encrypts_unless_the_user_turns_it_off(tmp_path, caplog):
    on = spark_configs(ClusterSettings(), tmp_path)
    assert on["spark.authenticate"] == on["spark.network.crypto.enabled"] == "true"
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        off = spark_configs(ClusterSettings(spark_conf={"spark.network.crypto.enabled": False,
                                                        SECRET: "mine"}), tmp_path)
    assert off["spark.network.crypto.enabled"] == "False" and off["spark.authenticate"] == "true"
    assert SECRET not in off  # RayDP puts every setting on its app master's command line
    [warning] = caplog.records
    assert "spark.network.crypto.enabled=False" in warning.message
    assert "unencrypted" in warning.message and "docs/security.md" in warning.message


def test_the_credentials_file_holds_the_secret_under_sparks_key():
    secret = "ab" * 32
    data = credentials(secret)
    assert data.startswith(b"HDTS\x00\x00\x01\x0bsparkCookie\x40")  # no tokens, one secret key
    assert spark_secret_of(data) == secret
    with pytest.raises(ValueError):
        spark_secret_of(data[:-1])
    with pytest.raises(ValueError):
        credentials("x" * 128)  # past one byte's length: not what Hadoop would read


def test_the_secrets_directory_is_the_users_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(spark_security.tempfile, "gettempdir", lambda: str(tmp_path))
    made = secret_dir()
    assert made.stat().st_mode & 0o777 == 0o700
    made.chmod(0o755)
    with pytest.raises(PermissionError, match="remove it"):
        secret_dir()


def test_bind_address_is_an_ip_address():
    validate(make_config("cluster.bind_address=0.0.0.0"))
    with pytest.raises(InputError, match="cluster.bind_address=my-laptop .*an IP address"):
        validate(make_config("cluster.bind_address=my-laptop"))
    assert is_loopback("::ffff:127.0.0.1") and is_loopback("127.0.0.1") and is_loopback("::1")
    assert not is_loopback("::") and not is_loopback("0.0.0.0")


def test_a_killed_drivers_credentials_files_are_reaped_by_the_next(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead = tmp_path / f"spark-{ended.pid}-00ff.creds"
    alive = tmp_path / f"spark-{os.getpid()}-00ff.creds"
    for path in (dead, alive):
        path.write_bytes(credentials("ab" * 32))
    assert reap_stale(tmp_path) == [dead]
    assert not dead.exists() and alive.exists()


def test_the_embedded_ray_takes_the_bind_address_and_opening_it_says_so(caplog):
    """127.0.0.1 by default (Ray's single-machine mode while the embedded Ray starts: raydp_fixes,
    5); another address is the node's, with one warning; a cluster's nodes keep theirs."""
    assert init_options(ClusterSettings(), "r", 0)["_node_ip_address"] == "127.0.0.1"
    assert init_options(ClusterSettings(bind_address="10.1.2.3"), "r", 0)[
        "_node_ip_address"] == "10.1.2.3"
    assert "_node_ip_address" not in init_options(ClusterSettings(bind_address="0.0.0.0"), "r", 0)
    assert "_node_ip_address" not in init_options(ClusterSettings(address="auto"), "r", 0)
    before = os.environ.get(SINGLE_MACHINE)
    with node_address(ClusterSettings()):
        assert os.environ[SINGLE_MACHINE] == "0"
    assert os.environ.get(SINGLE_MACHINE) == before and not caplog.records
    with caplog.at_level(logging.WARNING), node_address(ClusterSettings(bind_address="0.0.0.0")):
        assert os.environ.get(SINGLE_MACHINE) == before
    [warning] = caplog.records
    assert "cluster.bind_address=0.0.0.0" in warning.message
    assert "open to the network" in warning.message


def test_ray_trains_state_actor_is_asked_for_only_where_a_dashboard_can_show_it(monkeypatch):
    """RAY_TRAIN_ENABLE_STATE_TRACKING: on with the embedded Ray's dashboard and on a cluster
    (whose dashboard is the head's), left unset for an embedded Ray without one."""
    from raydp_llm.engines.ray_cluster import set_ray_environment

    for cluster, tracked in [(ClusterSettings(), "1"), (ClusterSettings(dashboard=False), None),
                             (ClusterSettings(address="auto", dashboard=False), "1")]:
        # a copy of the environment, so that the test leaves this process's as it was
        monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                            if k != "RAY_TRAIN_ENABLE_STATE_TRACKING"})
        set_ray_environment(cluster)
        assert os.environ.get("RAY_TRAIN_ENABLE_STATE_TRACKING") == tracked, cluster


def test_a_driver_joining_a_ray_on_the_loopback_takes_the_loopback_too():
    """Another process's embedded Ray listens on 127.0.0.1: a driver joining it enters Ray's
    single-machine mode for its ``ray.init`` (else Ray gives it the machine's address, where
    nothing of that Ray listens: tests/integration/test_spark_turns.py)."""
    from raydp_llm.engines.ray_cluster import _on_loopback, node_address

    assert _on_loopback("127.0.0.1:6379") and _on_loopback("ray://localhost:10001")
    assert not _on_loopback("10.0.0.5:6379") and not _on_loopback("auto")
    assert not _on_loopback("head.ec2.internal:6379")
    before = os.environ.get(SINGLE_MACHINE)
    with node_address(ClusterSettings(address="127.0.0.1:6379")):
        assert os.environ[SINGLE_MACHINE] == "0"
    with node_address(ClusterSettings(address="10.0.0.5:6379")):
        assert os.environ.get(SINGLE_MACHINE) == before
    assert os.environ.get(SINGLE_MACHINE) == before
