"""Spark asks for its application's secret on every cluster, the embedded one included.

Each Spark application gets its own secret, 256 random bits (``spark_secret``). Spark checks it on
every connection to its driver, its executors and RayDP's app master (``spark.authenticate``), and
encrypts what they send each other (``spark.network.crypto.enabled``: AES with keys agreed per
connection). How each JVM gets the secret, written nowhere another user, a log or the process list
shows it:

- the driver: a system property of its JVM, set through py4j once it runs
  (``SparkSecret.hand_to``), never a setting given to RayDP, which puts each on its app master's
  command line, nor one on the driver's command line; Spark's event log and UI redact it
  (``spark.redaction.regex``);
- RayDP's app master and executors (Ray's Java actors, started with the Java options RayDP is
  given): a Hadoop credentials file holding it, 0600 in a 0700 directory of this user on every
  node, named by ``-Dhadoop.token.files``. Spark's SecurityManager looks in the user's Hadoop
  credentials first; it reads ``spark.authenticate.secret.file`` on Kubernetes only, and RayDP
  hands its actors no environment (``_SPARK_AUTH_SECRET``). The files go when Spark stops.

``cluster.spark_conf`` can still turn either protection off, with one warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raydp_llm.core.config import ClusterSettings

log = logging.getLogger(__name__)

SECRET = "spark.authenticate.secret"
# Spark's protections, on unless cluster.spark_conf says otherwise, and what turning each off opens
PROTECTIONS = {
    "spark.authenticate": "anyone who reaches a Spark port can run tasks and read the data",
    "spark.network.crypto.enabled": "the data blocks cross the network unencrypted",
}
COOKIE = b"sparkCookie"  # the key Spark's SecurityManager reads in Hadoop's credentials


@dataclass(frozen=True)
class SparkSecret:
    """One Spark application's secret and the credentials file holding it on every node."""

    value: str
    file: Path

    def java_flags(self) -> list[str]:
        """The Java options that point RayDP's app master and executors at the file."""
        return [f"-Dhadoop.token.files={self.file}"]

    def hand_to(self, jvm) -> None:
        """Give the driver's JVM (py4j's view of it) the secret, before its SparkContext is made:
        a SparkConf reads Spark's settings from the system properties."""
        jvm.java.lang.System.setProperty(SECRET, self.value)


def user_settings(cfg: ClusterSettings) -> dict[str, str]:
    """``cluster.spark_conf`` as Spark's settings: keys and values as strings."""
    return {str(k): str(v) for k, v in (cfg.spark_conf or {}).items()}


def turned_off(user: dict[str, str], key: str) -> bool:
    """Whether the user's settings turn the protection ``key`` off (it is on unless they do)."""
    return user.get(key, "true").lower() != "true"


def protection_settings(user: dict[str, str]) -> dict[str, str]:
    """Spark's protections on, with one warning for each that ``cluster.spark_conf`` (``user``)
    turns off."""
    for key, opened in PROTECTIONS.items():
        if turned_off(user, key):
            log.warning("cluster.spark_conf sets %s=%s: %s; remove it to protect Spark again "
                        "(docs/security.md)", key, user[key], opened)
    return dict.fromkeys(PROTECTIONS, "true")


@contextlib.contextmanager
def spark_secret(cfg: ClusterSettings) -> Iterator[SparkSecret | None]:
    """A new secret for one Spark application (or the one ``cluster.spark_conf`` sets), its
    credentials file on every node of the Ray cluster, removed on exit; None when
    ``cluster.spark_conf`` turns authentication off."""
    user = user_settings(cfg)
    if turned_off(user, "spark.authenticate"):
        yield None
        return
    if SECRET in user:
        log.warning("cluster.spark_conf sets %s: it is written in the run's .hydra/config.yaml; "
                    "leave it out and each Spark application gets a secret of its own", SECRET)
    directory = secret_dir()
    reap_stale(directory)
    secret = SparkSecret(user.get(SECRET) or secrets.token_hex(32),
                         directory / f"spark-{os.getpid()}-{secrets.token_hex(8)}.creds")
    try:
        _on_every_node(_write_credentials, secret.file, credentials(secret.value))
        yield secret
    finally:
        try:
            _on_every_node(_remove, secret.file)
        except Exception as err:  # noqa: BLE001 - a node lost meanwhile: its file went with it
            log.warning("could not remove %s from every node (%s)", secret.file, err)


def credentials(secret: str) -> bytes:
    """Hadoop's credentials file (``Credentials.writeTokenStorageFile`` in its first format,
    which Hadoop 3 still reads): magic, version 0, no tokens, one secret key."""
    value = secret.encode()
    return (b"HDTS\x00" + _vint(0) + _vint(1) + _vint(len(COOKIE)) + COOKIE
            + _vint(len(value)) + value)


def _vint(n: int) -> bytes:
    """Hadoop's variable-length int (WritableUtils.writeVInt) of 0-127: one byte."""
    if not 0 <= n < 128:
        raise ValueError(f"{n} does not fit one byte of a Hadoop vint")
    return bytes([n])


def secret_dir() -> Path:
    """This user's private directory for Spark's credentials files, under the temp directory."""
    path = Path(tempfile.gettempdir()) / f"raydp_llm-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} is not this user's alone (mode {st.st_mode & 0o777:o}, "
                              f"owner {st.st_uid}): remove it, and the next run makes it afresh")
    return path


def reap_stale(directory: Path) -> list[Path]:
    """Remove the credentials files of this node's drivers that have ended without removing
    theirs (killed: their name holds their pid); returns them. A killed driver's files on the
    cluster's other nodes stay (the secret of an application that is gone)."""
    stale = []
    for path in directory.glob("spark-*-*.creds"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            path.unlink(missing_ok=True)
            stale.append(path)
    return stale


def _write_credentials(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, 0600 from its creation."""
    secret_dir()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def _on_every_node(fn, *args, timeout_s: float = 120.0) -> None:
    """Run ``fn(*args)`` here, and as a Ray task on every other live node of the cluster."""
    fn(*args)
    here = ray.get_runtime_context().get_node_id()
    others = [node["NodeID"] for node in ray.nodes() if node["Alive"] and node["NodeID"] != here]
    task = ray.remote(num_cpus=0)(fn)
    ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
             .remote(*args) for node in others], timeout=timeout_s)
