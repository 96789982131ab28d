"""transformers' families in the real ETL: the Spark executors encode a corpus of several files
with each family's tokenizer exactly as transformers' AutoTokenizer does (ids past 65,535 too).
The runs of these models: test_hf_runs.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import hf_models
from helpers.configs import make_config
from helpers.hf_models import HF_BIG_IDS
from helpers.s3 import BUCKET
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.core.errors import InputError
from raydp_llm.data.etl.records import EtlPlan
from raydp_llm.data.etl.run import run_etl
from raydp_llm.data.prepare import etl_tokenizer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("family", hf_models.FAMILIES)
def test_the_executors_ids_are_autotokenizers(spark, hf_files, hf_families, family):
    from transformers import AutoTokenizer

    cfg = make_config("model=hf", f"model.path={hf_families[family]}", f"data.path={hf_files}")
    out = run_etl(spark, EtlPlan.of(cfg, check_inputs(cfg), etl_tokenizer(cfg.tokenizer)))
    pieces = sorted((r.src, r.block, r.part, bytes(r.tokens)) for r in out.encoded.collect())
    dtype = np.dtype(out.manifest.token_dtype)
    stream = np.concatenate([np.frombuffer(p[3], dtype) for p in pieces])
    auto = AutoTokenizer.from_pretrained(hf_families[family])
    expected = []
    for path in sorted(hf_files.iterdir()):  # an end-of-document token before each file
        expected += [auto.eos_token_id] + auto(path.read_text(),
                                               add_special_tokens=False).input_ids
    assert stream.tolist() == expected
    assert dtype == (np.uint32 if family == "qwen2" else np.uint16)
    assert (stream.min() >= HF_BIG_IDS) == (family == "qwen2")


def test_a_model_on_s3_loads_once_per_node_and_a_missing_one_is_one_line(s3, hf_families,
                                                                          tmp_path, monkeypatch):
    from raydp_llm.core import storage
    from raydp_llm.models import files
    from raydp_llm.models.factory import build_model

    monkeypatch.setenv(files.MODEL_CACHE_ENV, str(tmp_path / "models"))
    uri = f"s3://{BUCKET}/models/llama"
    storage.publish(hf_families["llama"], uri, s3)
    settings = make_config("model=hf", f"model.path={uri}", f"s3.endpoint_url={s3.endpoint_url}")
    assert settings.model.block_size == 128  # its config and tokenizer read by the driver
    assert not any(p.suffix == ".safetensors" for p in Path(settings.tokenizer.path).iterdir())
    model = build_model(settings.model, s3)
    local = model.net.name_or_path
    assert Path(local).parent == tmp_path / "models" and (Path(local) / ".complete").is_file()
    assert files.local_copy(uri, s3) == Path(local)  # the second worker finds the copy
    with pytest.raises(InputError, match=rf"^model.path=s3://{BUCKET}/models/none: no config.json "
                                         r"there; give a directory that save_pretrained wrote"):
        make_config("model=hf", f"model.path=s3://{BUCKET}/models/none",
                    f"s3.endpoint_url={s3.endpoint_url}")
