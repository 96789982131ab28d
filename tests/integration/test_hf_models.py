"""transformers' families in the real ETL: the Spark executors encode a corpus of several files
with each family's tokenizer exactly as transformers' AutoTokenizer does (ids past 65,535 too).
The runs of these models: test_hf_runs.py."""

from __future__ import annotations

import numpy as np
import pytest

import hf_models
from conftest import HF_BIG_IDS, make_config
from raydp_llm.cli.inputs import check_inputs
from raydp_llm.data.etl import EtlPlan, run_etl
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
