"""Training on a dataset larger than Ray's object store: the chunks handed over from Spark
(``data.cache=false``) fill the object store, Ray spills what does not fit to disk, and each worker
fetches (restores) only the blocks of its own chunks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.configs import NO_CHECK

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end-to-end runs

OBJECT_STORE_MB = 80  # Ray's minimum is 75 MiB
# 2 MB blocks: a few dozen, not 340 of the default 512 KB (each block is one fetch task in the
# hand-off, ~0.15 s apiece on 2 cores); still many more than a worker reads
CHUNK_TOKENS = 2**20
# Ray refuses to spill once its disk is 95% full (OutOfDiskError), and CI machines' disks have been
# that full with gigabytes left: the test spills ~100 MB, so only a really full disk may stop it.
SPILL_ON_A_FULL_DISK = os.environ | {"RAY_local_fs_capacity_threshold": "1"}


def test_training_on_a_dataset_twice_the_object_store(shakespeare, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = shakespeare.read_bytes()
    for i in range(8):  # 89 MB of text: ~178 MB of uint16 tokens in the object store
        (corpus / f"copies{i}.txt").write_bytes(text * 10)
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "raydp_llm.train", "+experiment=smoke", f"data.path={corpus}",
         "data.max_files=null", "data.cache=false", NO_CHECK,
         f"cluster.object_store_mb={OBJECT_STORE_MB}", f"data.chunk_tokens={CHUNK_TOKENS}",
         "train.max_steps=20", "train.eval_interval=20", "train.eval_batches=2",
         "sample.max_new_tokens=5", f"hydra.run.dir={run}"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, env=SPILL_ON_A_FULL_DISK)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    stored = summary["etl"]["token_bytes_stored"]
    assert stored > 2 * OBJECT_STORE_MB * 2**20  # the dataset is twice the object store
    assert summary["status"] == "finished" and summary["steps"] == 20
    # each worker fetched only its own lanes' chunks: 8 lanes of 16, each within one chunk or
    # crossing into the next in 20 steps
    assert 0 < summary["chunks_read_per_worker"] <= 16 < summary["etl"]["chunks_train"]
    assert summary["windows_read_per_worker"] == 20 * 8
