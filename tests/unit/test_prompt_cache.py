"""The prompts' ETL cache entries (data/prompts/cache.py): keyed by what the prompts' ETL reads,
written whole and sealed, and a damaged one found and rebuilt (its Parquet truncated)."""

from __future__ import annotations

import json

from helpers.configs import make_config
from helpers.grpo_task import LocalPrompts
from raydp_llm.data import cache
from raydp_llm.data.chat.template import ChatTemplate
from raydp_llm.data.inputs.files import Corpus
from raydp_llm.data.prompts.cache import entry_problem, prompt_key, write
from raydp_llm.data.prompts.dataset import PromptData, PromptManifest

CORPUS = Corpus(["/data/prompts.jsonl"], False, "prompts",
                [{"path": "/data/prompts.jsonl", "size": 10, "mtime": 1.0}])


def test_the_key_holds_what_the_prompts_etl_reads_and_nothing_else():
    settings = make_config("data.format=prompts", "train.objective=grpo")
    key = prompt_key(settings, CORPUS, None, 48)
    assert key == prompt_key(make_config("data.format=prompts", "train.objective=grpo",
                                         "grpo.num_iterations=2", "optim.lr=1e-2"),
                             CORPUS, None, 48)  # training's settings: not the ETL's
    chatml = ChatTemplate("chatml", None, "{{ messages }}")
    changed = {
        prompt_key(settings, CORPUS, None, 40),
        prompt_key(settings, CORPUS, chatml, 48),
        prompt_key(make_config("data.format=prompts", "data.val_fraction=0.2"), CORPUS, None, 48),
        prompt_key(make_config("data.format=prompts", "seed=7"), CORPUS, None, 48),
        prompt_key(settings, Corpus(CORPUS.files, False, "prompts",
                                    [CORPUS.fingerprints[0] | {"mtime": 2.0}]), None, 48),
    }
    assert key not in changed and len(changed) == 5


def test_an_entry_is_written_whole_and_a_truncated_one_is_rebuilt(tmp_path):
    splits = {"train": LocalPrompts([(0, [5, 6]), (2, [7])]), "val": LocalPrompts([(1, [8])])}
    manifest = PromptManifest("prompts", {"kept": 3}, {"train": 2, "val": 1}, None, "bpe", 64,
                              limit=48)
    data = PromptData(None, manifest, splits, None, stats={"phase_s": {}})
    entry = write(data, tmp_path, "k1")
    assert entry == tmp_path / "k1" and entry_problem(entry) is None
    assert cache.lookup(tmp_path, "k1", entry_problem) == entry
    written = json.loads((entry / "prompt_manifest.json").read_text())
    assert written["splits"] == {"train": 2, "val": 1} and written["limit"] == 48

    parquet = entry / "val.parquet"
    parquet.write_bytes(parquet.read_bytes()[:-20])  # the fault: a truncated file
    assert "val.parquet has" in entry_problem(entry)
    assert cache.lookup(tmp_path, "k1", entry_problem) is None and not entry.exists()
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".k1.lock")]
