"""Chat rows rendered as transformers renders them (``data.format=chat``): the template (the model's
own, a ``.jinja`` file, or the built-in ``chatml``), a row's messages, and the rendered text with
the assistant turns' character spans marked.

The spans travel inside the text, between two private-use characters (``OPEN`` and ``CLOSE``), so
every stage between the reader and the encoder (curation, which keeps only ``src, block, raw``;
the scan; the tokenizer's sample) sees one text column; ``unmarked`` takes them out before the
text is counted, sampled or encoded. An assistant turn's span is its content and the end-of-turn
text after it: ``[len(render(messages[:i], add_generation_prompt=True)),
len(render(messages[:i + 1])))``; the encoder chooses which spans the loss counts
(``data.train_on``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from raydp_llm.core import storage
from raydp_llm.core.data_config import DataSettings
from raydp_llm.core.errors import InputError
from raydp_llm.core.storage import S3Options
from raydp_llm.core.tokenizer import CHAT_TEMPLATE_FILE as TEMPLATE_FILE

OPEN, CLOSE = "\ue000", "\ue001"  # an assistant turn's span starts, ends (private-use characters)
PAIR = "\ue003"  # between a preference pair's two sides (data/preference/pairs.py)
MARKS = re.compile(f"[{OPEN}{CLOSE}{PAIR}]")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHATML_SPECIALS = ("<|im_start|>", "<|im_end|>")  # a BPE the ETL trains for chatml keeps them whole
TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template and what renders with it: ``name`` (chatml, model or file), ``source`` (the
    file it was read from; None for chatml), ``text`` (the Jinja source), ``specials`` (the
    tokenizer's special tokens, which transformers hands the template: bos_token, eos_token...)."""

    name: str
    source: str | None
    text: str
    specials: dict = field(default_factory=dict)

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The text ``AutoTokenizer.apply_chat_template(messages, tokenize=False)`` makes."""
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template([messages], chat_template=self.text,
                                            add_generation_prompt=add_generation_prompt,
                                            **self.specials)
        return rendered[0]

    def end_of_turn(self) -> str:
        """The text right after an assistant turn's content (``<|im_end|>`` for chatml), its
        trailing white space left out: where generation stops."""
        content = "\ue002"  # a character no template adds
        text = self.render([{"role": "user", "content": "?"},
                            {"role": "assistant", "content": content}])
        return text[text.index(content) + 1:].rstrip()

    def manifest(self) -> dict:
        return {"template": self.name, "template_source": self.source,
                "template_text": self.text, "end_of_turn": self.end_of_turn()}


def resolve_template(setting: str | None, model_dir: str | None) -> ChatTemplate:
    """``data.chat_template``: ``chatml``, a ``.jinja`` file, or null: the model's own
    (``model_dir``'s tokenizer_config.json ``chat_template`` or chat_template.jinja), else
    chatml."""
    if setting == "chatml":
        return ChatTemplate("chatml", None, CHATML)
    if setting is not None:
        path = Path(setting)
        if not path.is_file():
            raise InputError(f"data.chat_template={setting}: no such file; name a Jinja chat "
                             "template file, or chatml, or leave it null for the model's own")
        return ChatTemplate("file", str(path), path.read_text(), _specials(_config(model_dir)))
    found = model_template(model_dir) if model_dir else None
    return found or ChatTemplate("chatml", None, CHATML)


def template_for(data: DataSettings, model_path: str | None, tokenizer: object
                 ) -> ChatTemplate | None:
    """The chat template that renders a chat ETL's conversations (``data.format=chat``, else
    None): ``data.chat_template``'s, or the model's own (``model_path``), else the tokenizer
    directory's, else chatml. Resolved once per ETL (``EtlPlan.of``)."""
    if not data.chat:
        return None
    at = model_path or getattr(tokenizer, "path", None)
    if at and Path(at).is_file():  # a tokenizer.json: its model directory keeps the template
        at = str(Path(at).parent)
    model_dir = at if at and Path(at).is_dir() else None
    return resolve_template(data.chat_template, model_dir)


def model_template(directory: str | Path, s3: S3Options = S3Options()) -> ChatTemplate | None:
    """A model directory's own template (local or ``s3://``: two small files read, not the model),
    if it has one: chat_template.jinja (what transformers 5 writes, and what a chat run here saves
    beside its model), else tokenizer_config.json's ``chat_template`` (a string; not a named
    set)."""
    config = _config(directory, s3)
    jinja = storage.join(str(directory), TEMPLATE_FILE)
    if storage.exists(jinja, s3):
        return ChatTemplate("model", jinja, storage.read_text(jinja, s3), _specials(config))
    if isinstance(config.get("chat_template"), str):
        return ChatTemplate("model", storage.join(str(directory), TOKENIZER_CONFIG),
                            config["chat_template"], _specials(config))
    return None


def _config(directory: str | Path | None, s3: S3Options = S3Options()) -> dict:
    """A model directory's tokenizer_config.json; none without one."""
    path = storage.join(str(directory), TOKENIZER_CONFIG)
    return storage.read_json(path, s3) if directory and storage.exists(path, s3) else {}


def _specials(config: dict) -> dict:
    """The special tokens transformers hands a template (``bos_token``...): tokenizer_config's."""
    out = {}
    for key, value in config.items():
        content = value.get("content") if isinstance(value, dict) else value
        if key.endswith("_token") and isinstance(content, str):
            out[key] = content
    return out


def messages_of(row: dict, messages_column: str, prompt_column: str,
                response_column: str) -> list[dict] | None:
    """A row's messages: its ``messages_column`` list of {role, content}, or its prompt and
    response as a user and an assistant turn; None when it has neither."""
    messages = row.get(messages_column)
    if messages is not None:
        return messages
    if row.get(prompt_column) is None or row.get(response_column) is None:
        return None
    return [{"role": "user", "content": row[prompt_column]},
            {"role": "assistant", "content": row[response_column]}]


def marked(template: ChatTemplate, messages: list[dict], where: str) -> str:
    """The conversation rendered, each assistant turn's span between ``OPEN`` and ``CLOSE``.
    ``where`` names the row in the one-line errors: a message that is no {role, content}, marks in
    the text, an empty assistant turn, a role the template refuses, a template whose render of the
    first turns is not the start of the whole (no spans can be found)."""
    from jinja2 import TemplateError

    check_messages(messages, where)
    try:
        text = template.render(messages)
        spans = [_span(template, messages, i, text, where)
                 for i, m in enumerate(messages) if m["role"] == "assistant"]
    except TemplateError as err:
        raise InputError(f"{where}: the chat template ({template.name}) refuses the conversation: "
                         f"{str(err).splitlines()[0][:120]}; fix the row's roles or choose "
                         "another data.chat_template") from None
    for start, end in reversed(spans):
        text = text[:start] + OPEN + text[start:end] + CLOSE + text[end:]
    return text


def check_messages(messages: list[dict], where: str) -> None:
    """Messages that are dicts with string role and content; no marks; no empty assistant turn."""
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise InputError(f"{where}: a message is not a {{role, content}} pair of strings "
                             f"({str(m)[:60]!r}); fix the row")
        if MARKS.search(m["content"]):
            raise InputError(f"{where}: a message holds the private-use characters U+E000, "
                             "U+E001 or U+E003 the ETL marks spans with; remove them from the "
                             "row")
        if m["role"] == "assistant" and not m["content"].strip():
            raise InputError(f"{where}: an assistant turn is empty; remove the row or give the "
                             "turn its content")


def _span(template: ChatTemplate, messages: list[dict], i: int, text: str,
          where: str) -> tuple[int, int]:
    """Assistant turn ``i``'s characters in ``text`` (the whole conversation rendered)."""
    before = template.render(messages[:i], add_generation_prompt=True)
    upto = template.render(messages[:i + 1])
    if not (text.startswith(before) and text.startswith(upto)):
        raise InputError(f"{where}: the chat template ({template.name}) renders the first turns "
                         "otherwise than the start of the whole conversation, so the assistant "
                         "turns cannot be found; use a template that renders turn by turn")
    return len(before), len(upto)


def unmarked(text: str) -> tuple[str, list[tuple[int, int]]]:
    """The text without its marks, and the marked spans in it (character offsets)."""
    pieces = MARKS.split(text)
    plain, spans, length, start = "".join(pieces), [], 0, 0
    for piece, mark in zip(pieces, MARKS.findall(text)):
        length += len(piece)
        if mark == OPEN:
            start = length
        elif mark == CLOSE:
            spans.append((start, length))
    return plain, spans


def strip_marks(text: str) -> str:
    return MARKS.sub("", text)


class RowRenderer:
    """A reader's step of one Spark task (``mapInArrow``): ``src, block, text`` rows (a JSON object
    each: a JSON line, or a Parquet row as Spark's ``to_json`` writes it) in, the same rows with
    ``text`` as ``render_row`` renders it out (blank lines stay blank). One line names the file and
    the row that is no JSON."""

    corpus = "chat"  # what the one line calls the corpus

    def render_row(self, row, where: str) -> str:
        raise NotImplementedError

    def __call__(self, batches):
        import pyarrow as pa

        for batch in batches:
            texts = [self._render(src, (raw or b"").decode("utf-8", "replace"))
                     for src, raw in zip(batch.column("src").to_pylist(),
                                         batch.column("text").to_pylist())]
            yield pa.RecordBatch.from_pydict(
                {"src": batch.column("src"), "block": batch.column("block"),
                 "text": pa.array([t.encode() for t in texts], pa.binary())})

    def _render(self, src: str, line: str) -> str:
        if not line.strip():
            return ""
        where = f"{src}: the row {line[:60]!r}"
        try:
            row = json.loads(line)
        except ValueError:
            raise InputError(f"{where} is not JSON; fix the line (a {self.corpus} corpus holds a "
                             "JSON object a line)") from None
        return self.render_row(row, where)


class Renderer(RowRenderer):
    """The chat reader's renderer: ``text`` the marked, rendered conversation. One line names the
    file and the row that has no messages (nor prompt and response), or that the template refuses
    (``marked``)."""

    def __init__(self, template: ChatTemplate, messages_column: str, prompt_column: str,
                 response_column: str):
        self.template = template
        self.columns = (messages_column, prompt_column, response_column)

    def render_row(self, row, where: str) -> str:
        messages = messages_of(row, *self.columns) if isinstance(row, dict) else None
        if not isinstance(messages, list):
            messages_column, prompt_column, response_column = self.columns
            raise InputError(f"{where} has no {messages_column} list and no {prompt_column}/"
                             f"{response_column} pair; name its fields with data.messages_column, "
                             "or data.prompt_column and data.response_column")
        return marked(self.template, messages, where)
