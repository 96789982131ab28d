"""Chat templates: where a model keeps its own (``chat_template.jinja``, or the ``chat_template``
of ``tokenizer_config.json``), the built-in ChatML, and a conversation rendered as transformers
renders it (its own Jinja environment: ``render_jinja_template``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from raydp_llm.core.tokenizer import CHAT_TEMPLATE_FILE as TEMPLATE_FILE

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PROBE = "\ue000"  # a private-use character no template writes: where an assistant reply goes


def model_template(directory: str | Path) -> str | None:
    """The chat template a model directory carries, or None."""
    directory = Path(directory)
    if (directory / TEMPLATE_FILE).is_file():
        return (directory / TEMPLATE_FILE).read_text()
    config = directory / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if isinstance(template, str):  # a list of named templates is not read here
            return template
    return None


def special_tokens(directory: str | Path | None) -> dict[str, str]:
    """The special tokens a template may write (``bos_token``, ``eos_token``, ...), as
    tokenizer_config.json names them; none without one."""
    config = Path(directory or "") / "tokenizer_config.json"
    if not directory or not config.is_file():
        return {}
    entries = json.loads(config.read_text())
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    return {n: _content(entries[n]) for n in names if entries.get(n)}


def _content(token) -> str:
    return token["content"] if isinstance(token, dict) else str(token)


def render(template: str, messages: list[dict], add_generation_prompt: bool = False,
           specials: dict[str, str] | None = None) -> str:
    """``messages`` as text, exactly as ``apply_chat_template(tokenize=False)`` writes it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template,
                                        add_generation_prompt=add_generation_prompt,
                                        **(specials or {}))
    return rendered[0]


def end_of_turn(template: str, specials: dict[str, str] | None = None) -> str:
    """The text a template writes right after an assistant reply (``<|im_end|>`` for ChatML),
    white space stripped: generation stops where the model writes it."""
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": PROBE}]
    after = render(template, messages, specials=specials).rsplit(PROBE, 1)[-1]
    return after.strip() or (specials or {}).get("eos_token", "")


@dataclass(frozen=True)
class ChatFormat:
    """A template with the special tokens it may write, and where its assistant turns end."""

    template: str
    specials: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_model(cls, directory: str | Path) -> ChatFormat | None:
        """The chat format a model directory carries, or None."""
        template = model_template(directory)
        return None if template is None else cls(template, special_tokens(directory))

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return render(self.template, messages, add_generation_prompt, self.specials)

    @property
    def end_of_turn(self) -> str:
        return end_of_turn(self.template, self.specials)
