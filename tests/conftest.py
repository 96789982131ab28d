"""Shared fixtures: one embedded Ray for the whole session, configs composed with Hydra."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from raydp_llm.cli.inputs import typed_settings
from raydp_llm.core.registry import register_configs

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
register_configs()  # the schemas every composed config (compose_config) stands on


BUCKET = "raydp-llm-test"  # in the s3 fixture's server
# tests never touch the user's ETL cache
CACHE_DIR = tempfile.mkdtemp(prefix="raydp_llm_test_cache_")

# Credentials for the local S3 stand-in (tests/integration/test_s3.py), where the standard AWS
# chain looks first, set before any Ray, Spark or Ray Train worker starts so that all of them
# inherit it; no instance metadata lookups.
for _key, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ.setdefault(_key, _value)


def pytest_collection_modifyitems(items):
    """Everything under tests/integration/ runs the real engines: ``-m "not integration"`` skips
    it."""
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)


def compose_config(*overrides: str, config_name: str = "config"):
    """An entry point's composed config (``config``, ``evaluate``) with Hydra overrides (ETL cache
    in a temp dir), as Hydra hands it to the entry point."""
    if not any(o.startswith("data.cache_dir=") for o in overrides):
        overrides = (f"data.cache_dir={CACHE_DIR}", *overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def prepare(settings, corpus, out_dir: Path, to_ray: bool, store: Path | None):
    """The ETL step (``data.prepare.prepared``) for a test that needs no Spark kept up after it."""
    from raydp_llm.data.prepare import prepared

    with prepared(settings, corpus, out_dir, to_ray=to_ray, store=store) as data:
        return data


# The contamination check costs about 5 s an ETL: the tests of other things leave it off (the
# curated ETL tests and the two-node run keep it).
NO_CHECK = "data.decontaminate=off"


def make_config(*overrides: str, config_name: str = "config"):
    """The typed settings an entry point makes of that config at its door
    (``cli.inputs.typed_settings``), the contamination check off unless an override sets it."""
    if not any(o.startswith("data.decontaminate=") for o in overrides):
        overrides = (NO_CHECK, *overrides)
    return typed_settings(compose_config(*overrides, config_name=config_name), overrides)


@pytest.fixture
def one_torch_thread():
    """Tiny models: one thread is fastest, and far faster on a machine busy with other work."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    if not SHAKESPEARE.is_file():
        pytest.fail(f"benchmark corpus missing: {SHAKESPEARE} (the shared/ folder beside the "
                    "checkout)")
    return SHAKESPEARE


@pytest.fixture(scope="session")
def s3():
    """A local S3 stand-in: a moto server on 127.0.0.1 with the bucket ``BUCKET``; its endpoint as
    ``S3Options``. The credentials are the fake ``AWS_*`` environment above, which Ray's and Spark's
    workers inherit."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    from raydp_llm.core.storage import S3Options

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    pafs.S3FileSystem(
        endpoint_override=f"{host}:{port}", scheme="http", allow_bucket_creation=True
    ).create_dir(BUCKET)
    yield S3Options(endpoint_url=f"http://{host}:{port}")
    server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on 127.0.0.1 (SQLite store, artifacts served by the server
    from a local directory); its URI."""
    import socket
    import time
    import urllib.request

    home = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
         "--artifacts-destination", (home / "artifacts").as_uri()],
        stdout=subprocess.DEVNULL, stderr=(home / "server.log").open("w"), start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).close()
            break
        except OSError:
            log = (home / "server.log").read_text()
            assert server.poll() is None and time.time() < deadline, log
            time.sleep(0.5)
    yield uri
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


@pytest.fixture(scope="session")
def ray_cluster():
    """An embedded Ray started once per test session (Spark is started per test on it)."""
    from raydp_llm.engines.ray_cluster import ray_session

    with ray_session(make_config().cluster, "tests"):
        yield


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, shakespeare) -> Path:
    """Three documents cut from the benchmark corpus (the last one ends without a newline)."""
    text = shakespeare.read_text()
    d = tmp_path_factory.mktemp("corpus")
    for i, (a, b) in enumerate([(0, 20_000), (20_000, 21_000), (50_000, 65_000)]):
        (d / f"part{i}.txt").write_text(text[a:b].rstrip("\n") if i == 2 else text[a:b])
    return d


@pytest.fixture(scope="session")
def hf_files(tmp_path_factory, shakespeare) -> Path:
    """Three files of a play each (blank lines and all), each ending with a newline: the corpus the
    transformers families' tests encode and train on."""
    text = shakespeare.read_text()
    d = tmp_path_factory.mktemp("hf_corpus")
    for i, (a, b) in enumerate([(0, 30_000), (30_000, 31_000), (60_000, 90_000)]):
        (d / f"part{i}.txt").write_text(text[a:b].rstrip("\n") + "\n")
    return d


HF_BIG_IDS = 66_000  # the Qwen2 checkpoint's ids all lie above 65,535


@pytest.fixture(scope="session")
def hf_families(tmp_path_factory, shakespeare) -> dict[str, Path]:
    """A tiny checkpoint of each tested family (tests/hf_models.py), the Qwen2 one with ids past
    65,535."""
    import hf_models

    text = shakespeare.read_text()
    texts = [text[i:i + 2000] for i in range(0, 100_000, 2000)]
    root = tmp_path_factory.mktemp("families")
    return {f: hf_models.build(f, root / f, texts, offset=HF_BIG_IDS if f == "qwen2" else 0)
            for f in hf_models.FAMILIES}


def write_lines(path: Path, lines: list[str]) -> None:
    """Lines to a file, compressed as its suffix says (.gz, .bz2, .zst: pyarrow's codecs)."""
    import pyarrow as pa

    data = "".join(line + "\n" for line in lines).encode()
    codec = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}.get(path.suffix)
    if codec is None:
        path.write_bytes(data)
        return
    with pa.CompressedOutputStream(str(path), codec) as out:
        out.write(data)


def start_like_a_terminal(module: str, *args: str) -> subprocess.Popen:
    """``python -m module args`` with SIGINT at its default, as a terminal's Ctrl-C would find it (a
    runner started in the background, ``cmd &``, ignores SIGINT, and the child would inherit
    that)."""
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# ---------------------------------------------------------------- the data package's helpers


class StoredChunks:
    """Chunk rows as the ETL stores them: cut per piece, each with the halo after it."""

    def __init__(self, rows: dict[int, bytes]):
        self.rows, self.fetched = rows, []

    def fetch(self, c, start):
        self.fetched.append(c)
        return self.rows[start]


def chunked(stream, lengths, segments_of, chunk_tokens, halo):
    """What the ETL makes of ``stream`` cut into pieces of ``lengths``: each split's index and its
    stored chunks, cut piece by piece from the piece's tokens and its halo (etl.chunks.cut_chunks).
    """
    import numpy as np

    from raydp_llm.data import windows
    from raydp_llm.data.stream import ChunkIndex

    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pieces = [stream[o:o + k] for o, k in zip(offsets, lengths)]
    piece_halos = windows.halos([p[:halo] for p in pieces], halo)
    rows = {"train": [], "val": []}
    stored = {"train": {}, "val": {}}
    for off, piece, after in zip(offsets, pieces, piece_halos):
        local = np.concatenate([piece, after])
        for s in windows.chunk_spans(int(off), int(off) + len(piece), segments_of, chunk_tokens):
            rows[s.split].append((s.start, s.end - s.start, s.seg_start, s.seg_end))
            stored[s.split][s.start] = local[s.start - off:min(s.end + halo, s.seg_end) - off]
    return ({k: ChunkIndex.of(v) for k, v in rows.items()},
            {k: StoredChunks({a: t.tobytes() for a, t in v.items()}) for k, v in stored.items()})


@pytest.fixture(scope="module")
def spark(ray_cluster, tmp_path_factory, request):
    """One RayDP Spark session for a module's ETL runs (test_etl, test_curated_etl,
    test_spark_engine), named for the module."""
    from raydp_llm.engines.spark import spark_session

    cfg = make_config()
    with spark_session(cfg.cluster, app_name=request.module.__name__.rsplit(".", 1)[-1],
                       log_dir=tmp_path_factory.mktemp("spark")) as session:
        yield session


# ---------------------------------------------------------------- the launch scripts' helpers
# (tests/unit/test_launch.py, tests/unit/test_launch_submit.py)

LAUNCH = ROOT / "launch"
BOOTSTRAP = LAUNCH / "emr" / "bootstrap.sh"
CREATE = LAUNCH / "emr" / "create_cluster.sh"
SUBMIT = LAUNCH / "submit.sh"
TUNNEL = LAUNCH / "tunnel.sh"
TEARDOWN = LAUNCH / "teardown.sh"


@pytest.fixture
def env(tmp_path) -> dict:
    """A clean environment: HOME in tmp_path, no token, and stand-ins for aws/ssh/ray that record
    calls."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name in ("aws", "ssh", "ray"):
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{tmp_path}/called"\nexit 97\n')
        stub.chmod(0o755)
    (tmp_path / "home").mkdir()
    e = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "EMR_", "NODE_", "AWS_"))}
    e.update(HOME=str(tmp_path / "home"), PATH=f"{stubs}{os.pathsep}{e['PATH']}")
    yield e
    called = tmp_path / "called"
    assert not called.exists(), f"a dry run called: {called.read_text()}"


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
