"""The encode stage of ``data.format=prompts`` (learning from rewards), in the executors: each row
(a JSON object: a JSON line, or a Parquet or query row as Spark's ``to_json`` writes it) becomes
its prompt's text and ids and its other columns, carried as they are (JSON) to the rewards.

A row's prompt is ``data.prompt_column`` (a string: the user's turn, rendered with the chat template
and its generation prompt, as the DPO path renders a prompt; raw text without a template) or
``data.messages_column`` (a list of messages, rendered alike). Its ids are the rendered text's,
no special tokens added (the template carries them). A prompt longer than ``limit`` tokens (the
block less ``grpo.max_new_tokens``) follows ``data.overlong``: ``drop``, ``truncate`` (its last
``limit`` tokens, as TRL cuts a prompt from the left) or ``error`` (one line naming its file and
row). Each output row keeps its file, input split and place in that split (``row``): the table's
order, which the driver numbers (``prompts/dataset.py``)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from raydp_llm.core.config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.tokenizer import Tokenizer, tokenizer_from_json
from raydp_llm.data.chat.encode import token_starts
from raydp_llm.data.chat.template import ChatTemplate

# a row's verdict: kept (as is, or truncated), or why it was left out
KEPT, TRUNCATED, NO_PROMPT, OVERLONG, BAD_JSON = ("kept", "truncated", "no_prompt", "overlong",
                                                  "not_json")
PROMPT_SCHEMA = pa.schema([
    ("src", pa.string()), ("block", pa.int64()), ("row", pa.int64()), ("ids", pa.binary()),
    ("text", pa.string()), ("columns", pa.string()), ("verdict", pa.string())])
ID_DTYPE = np.int32  # a prompt's ids as stored


class PromptEncoder:
    """The prompts' encode step of one Spark task (``mapInArrow``): ``src, block, text`` rows in,
    ``PROMPT_SCHEMA`` rows out, one per input row that is not blank."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate | None, data: DataSettings,
                 limit: int):
        self.tokenizer_json, self.template, self.limit = tokenizer.to_json(), template, limit
        self.prompt_column, self.messages_column = data.prompt_column, data.messages_column
        self.overlong = data.overlong

    def __call__(self, batches):
        tok, rows_in = tokenizer_from_json(self.tokenizer_json), {}
        for batch in batches:
            out = {name: [] for name in PROMPT_SCHEMA.names}
            parsed = []
            for src, block, raw in zip(*(batch.column(c).to_pylist()
                                         for c in ("src", "block", "text"))):
                line = (raw or b"").decode("utf-8", "replace")
                if not line.strip():
                    continue
                row = rows_in[(src, block)] = rows_in.get((src, block), -1) + 1
                parsed.append((src, block, row, *self._render(line, f"{src}: row {row + 1}")))
            ids = iter(token_starts(tok, [text for *_, text, _, _ in parsed]))
            for src, block, row, text, columns, verdict in parsed:
                found, _ = next(ids)
                found, verdict = self._fitted(found, verdict, f"{src}: row {row + 1}")
                for name, value in zip(PROMPT_SCHEMA.names, (
                        src, block, row, found.astype(ID_DTYPE).tobytes(), text, columns,
                        verdict)):
                    out[name].append(value)
            yield pa.RecordBatch.from_pydict(out, schema=PROMPT_SCHEMA)

    def _render(self, line: str, where: str) -> tuple[str, str, str]:
        """A row's prompt text, its other columns (JSON) and its verdict so far."""
        try:
            row = json.loads(line)
        except ValueError:
            return "", "{}", BAD_JSON
        if not isinstance(row, dict):
            return "", "{}", BAD_JSON
        messages = self._messages(row, where)
        if messages is None:
            return "", "{}", NO_PROMPT
        others = {k: v for k, v in row.items() if k not in (self.prompt_column,
                                                            self.messages_column)}
        if self.template is None:
            return messages[-1]["content"], json.dumps(others), KEPT
        return (self.template.render(messages, add_generation_prompt=True), json.dumps(others),
                KEPT)

    def _messages(self, row: dict, where: str) -> list[dict] | None:
        """The row's prompt as messages: its messages column, or its prompt column as the user's
        turn; None when it has neither."""
        messages = row.get(self.messages_column)
        if isinstance(messages, list) and messages:
            if self.template is None:
                raise InputError(f"{where}: {self.messages_column} holds messages but the model "
                                 "has no chat template to render them; give data.chat_template "
                                 "(a .jinja file, or chatml), or a prompt column of text")
            return messages
        prompt = row.get(self.prompt_column)
        if isinstance(prompt, str) and prompt.strip():
            return [{"role": "user", "content": prompt}]
        return None

    def _fitted(self, ids: np.ndarray, verdict: str, where: str) -> tuple[np.ndarray, str]:
        """``ids`` within ``limit`` tokens, as ``data.overlong`` says."""
        if verdict != KEPT or len(ids) <= self.limit:
            return ids, verdict
        if self.overlong == "error":
            raise InputError(f"{where}: the prompt has {len(ids)} tokens, more than "
                             f"model.block_size - grpo.max_new_tokens = {self.limit}; shorten it, "
                             "or set data.overlong=drop or truncate")
        if self.overlong == "drop":
            return ids[:0], OVERLONG
        return ids[-self.limit:], TRUNCATED
