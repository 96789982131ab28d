"""Run identity on real files and real processes (no engine needed): which checkpoint
train.resume=auto continues when other runs are live, finished, or have continued each other; run
directories that are already taken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from raydp_llm.checkpoint.layout import STATE_JSON
from raydp_llm.core import integrity
from raydp_llm.core.errors import InputError
from raydp_llm.training.driver import runs
from raydp_llm.training.driver.runs import RunRecord, find_resumable

FINGERPRINT, MAX_STEPS = "f" * 20, 100


def make_run(root: Path, name: str, steps: list[int], **record) -> Path:
    """A run directory as train.py leaves it: its record, and checkpoints (sealed) in its Ray Train
    directory."""
    out = root / name
    ray_run = out / "ray_results" / f"raydp_llm-{name}"
    for i, step in enumerate(steps):
        ckpt = ray_run / f"checkpoint_{i:06d}"
        ckpt.mkdir(parents=True)
        torch.save({"x": torch.zeros(4)}, ckpt / "train_state.pt")
        (ckpt / STATE_JSON).write_text(json.dumps({"step": step, "fingerprint": FINGERPRINT}))
        integrity.seal(ckpt)
    rec = RunRecord(run_id=name, out_dir=str(out), **record)
    for place in (out / runs.RECORD, ray_run / runs.RECORD):
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_text(json.dumps(asdict(rec)))
    return ray_run


def dead_process() -> tuple[int, float]:
    """The pid and start time of a process that has ended."""
    import psutil

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(p.pid).create_time()
    p.wait()
    return p.pid, started


def test_a_live_run_is_never_resumed_a_dead_one_is(tmp_path):
    live = make_run(tmp_path, "a", [20, 40])  # this process: alive
    assert find_resumable(tmp_path, FINGERPRINT, MAX_STEPS) is None
    pid, started = dead_process()
    record = json.loads((live / runs.RECORD).read_text()) | {"pid": pid, "pid_started": started}
    (live / runs.RECORD).write_text(json.dumps(record))
    assert find_resumable(tmp_path, FINGERPRINT, MAX_STEPS) == str(live / "checkpoint_000001")
    # On another host only the heartbeat tells: fresh is live, stale (3 beats missed) is dead.
    record |= {"host": "elsewhere", "heartbeat": time.time()}
    (live / runs.RECORD).write_text(json.dumps(record))
    assert find_resumable(tmp_path, FINGERPRINT, MAX_STEPS) is None
    (live / runs.RECORD).write_text(
        json.dumps(record | {"heartbeat": time.time() - 4 * runs.HEARTBEAT_S})
    )
    assert find_resumable(tmp_path, FINGERPRINT, MAX_STEPS) == str(live / "checkpoint_000001")


def test_a_run_continued_by_a_finished_run_is_not_continued_again(tmp_path):
    pid, started = dead_process()
    a = make_run(tmp_path, "a", [20, 40], status="running", pid=pid, pid_started=started)  # killed
    assert find_resumable(tmp_path, FINGERPRINT, MAX_STEPS) == str(a / "checkpoint_000001")
    # B resumed A's checkpoint and finished: neither is continued.
    b = make_run(
        tmp_path, "b", [60, 100], resumed_from=str(a / "checkpoint_000001"), status="finished"
    )
    assert find_resumable(tmp_path, FINGERPRINT, MAX_STEPS) is None
    # Had B been killed before its last step, B's newest checkpoint would be next.
    shutil_rmtree(b / "checkpoint_000001")
    record = json.loads((b / runs.RECORD).read_text()) | {
        "status": "running",
        "pid": pid,
        "pid_started": started,
    }
    for place in (b / runs.RECORD, tmp_path / "b" / runs.RECORD):
        place.write_text(json.dumps(record))
    assert find_resumable(tmp_path, FINGERPRINT, MAX_STEPS) == str(b / "checkpoint_000000")


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def test_unfinished_or_damaged_checkpoints_are_skipped(tmp_path, caplog):
    pid, started = dead_process()
    a = make_run(tmp_path, "a", [20, 40, 60], pid=pid, pid_started=started)
    (a / "checkpoint_000002" / integrity.MARKER).unlink()  # killed while it was written
    (a / "checkpoint_000001" / "train_state.pt").write_bytes(b"x")  # truncated
    assert find_resumable(tmp_path, FINGERPRINT, MAX_STEPS) == str(a / "checkpoint_000000")
    assert f"skipping damaged checkpoint {a / 'checkpoint_000002'}: no complete.json" in caplog.text
    assert (
        f"skipping damaged checkpoint {a / 'checkpoint_000001'}: train_state.pt has 1 bytes"
        in caplog.text
    )
    assert (
        find_resumable(tmp_path, "another", MAX_STEPS) is None
    )  # another training: never continued


def test_a_run_directory_belongs_to_one_run(tmp_path):
    record = RunRecord(run_id=runs.new_run_id(), out_dir=str(tmp_path))
    runs.claim(tmp_path / "run", record)
    with pytest.raises(InputError, match=rf"{tmp_path / 'run'}: another run wrote there already "
                                         rf"\(run {record.run_id} \(pid {os.getpid()} on .*\)\); "
                                         r"leave hydra.run.dir"):
        runs.claim(tmp_path / "run", RunRecord(run_id=runs.new_run_id(), out_dir=str(tmp_path)))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "metrics.csv").write_text("step\n")  # a run of an older version: no record
    with pytest.raises(InputError, match=r"another run wrote there already \(metrics.csv\)"):
        runs.claim(tmp_path / "old", record)
    assert len({runs.new_run_id() for _ in range(100)}) == 100  # the same second, different ids


def test_a_run_refused_for_its_input_gives_its_directory_back(tmp_path):
    record = RunRecord(run_id=runs.new_run_id(), out_dir=str(tmp_path))
    with pytest.raises(InputError), runs.claimed(tmp_path / "refused", record):
        assert (tmp_path / "refused" / runs.RECORD).exists()
        raise InputError("train.storage_path is not set")
    runs.claim(tmp_path / "refused", record)  # the corrected command may use the directory
    # a run that wrote its metrics keeps the directory, refused or not
    with pytest.raises(InputError), runs.claimed(tmp_path / "wrote", record):
        (tmp_path / "wrote" / "metrics.csv").write_text("step\n")
        raise InputError("late")
    with pytest.raises(InputError, match="another run wrote there already"):
        runs.claim(tmp_path / "wrote", record)
    # any other failure keeps the claim: the run may have started work there
    with pytest.raises(RuntimeError), runs.claimed(tmp_path / "failed", record):
        raise RuntimeError("lost")
    assert (tmp_path / "failed" / runs.RECORD).exists()


def test_a_download_that_s3_breaks_off_is_tried_again(tmp_path):
    """storage.retried: the whole download again while it fails with an OSError, up to
    s3.max_attempts times; the last failure is raised."""
    from raydp_llm.core.storage import S3Options, retried

    target, attempts = tmp_path / "later.txt", []

    def download() -> str:
        attempts.append(1)
        if len(attempts) == 3:
            target.write_text("complete")
        return target.read_text()  # FileNotFoundError (an OSError) until the third attempt

    assert retried(download, S3Options(max_attempts=3)) == "complete" and len(attempts) == 3
    target.unlink()
    attempts.clear()
    with pytest.raises(FileNotFoundError):
        retried(download, S3Options(max_attempts=2))
    assert len(attempts) == 2


def test_an_s3_endpoint_where_nothing_listens_fails_at_its_first_client():
    """S3Options.filesystem: an endpoint that refuses the connection is an OSError at once, named;
    one that listens gets its client (its answers, errors too, are left to the retries)."""
    import socket

    from raydp_llm.core.storage import S3Options

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert S3Options(endpoint_url=f"http://127.0.0.1:{port}").filesystem() is not None
    # the port is closed now: nothing listens there
    with pytest.raises(OSError, match=rf"^nothing answers at s3.endpoint_url=http://127.0.0.1:"
                                      rf"{port} \(.*refused.*\); check its host and port$"):
        # other settings than above: a process keeps one client per settings
        S3Options(endpoint_url=f"http://127.0.0.1:{port}", max_attempts=3).filesystem()


@pytest.mark.parametrize("entry", ["generate", "export"])
def test_a_model_dir_on_an_s3_out_of_reach_is_one_line_naming_it(entry, tmp_path, capsys):
    import importlib
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # never listened on: refused
    main = importlib.import_module(f"raydp_llm.cli.{entry}").main
    args = ["model_dir=s3://b/run/model", f"s3.endpoint_url=http://127.0.0.1:{port}"]
    if entry == "export":
        args.append(f"out={tmp_path / 'out'}")
    assert main(args) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: model_dir=s3://b/run/model: cannot read it (nothing answers at "
                           f"s3.endpoint_url=http://127.0.0.1:{port}"), line
    assert not (tmp_path / "out").exists()
