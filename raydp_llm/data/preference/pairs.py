"""Preference rows rendered as TRL renders them (``data.format=preference``): a prompt and two
answers, the chosen and the rejected, each answer the full conversation's rendering after the
prompt's rendering with the generation prompt.

A row gives its prompt and answers as strings (``data.prompt_column``: a user turn, the answers an
assistant turn each), as lists of messages (the prompt's, and each answer's own), or as two whole
conversations (``data.chosen_column`` and ``data.rejected_column`` only) whose shared first
messages are the prompt. The pair travels as one text through the ETL's stages, as a chat row
does: the chosen side, ``PAIR``, the rejected side, each side its prompt then its answer between
``chat.OPEN`` and ``chat.CLOSE`` (``pair_sides`` takes them apart for the encoder). A row missing
an answer (or with an empty one) becomes ``PAIR`` alone, which the encoder counts and skips; with
``data.strict_json`` it stops the ETL, naming its file and row."""

from __future__ import annotations

from typing import NamedTuple

from raydp_llm.core.errors import InputError
from raydp_llm.data.chat.template import (
    CLOSE,
    OPEN,
    PAIR,
    ChatTemplate,
    RowRenderer,
    check_messages,
    unmarked,
)


class Side(NamedTuple):
    prompt: str  # the prompt rendered with the generation prompt
    answer: str  # the rest of the whole conversation's rendering


def split_prompt(row: dict, prompt_column: str, chosen_column: str,
                 rejected_column: str) -> tuple[list, list, list] | None:
    """The row's prompt messages and each answer's messages; None when an answer is missing or
    empty (or, for whole conversations, when nothing follows their shared prompt)."""
    chosen, rejected, prompt = row.get(chosen_column), row.get(rejected_column), row.get(
        prompt_column)
    if prompt is None and isinstance(chosen, list) and isinstance(rejected, list):
        shared = 0
        while (shared < min(len(chosen), len(rejected)) - 1
               and chosen[shared] == rejected[shared]):
            shared += 1
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
    prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    answers = [[{"role": "assistant", "content": a}] if isinstance(a, str) else a
               for a in (chosen, rejected)]
    if not isinstance(prompt, list) or not all(_answered(a) for a in answers):
        return None
    return prompt, answers[0], answers[1]


def _answered(messages) -> bool:
    return (isinstance(messages, list) and bool(messages)
            and all(isinstance(m, dict) and str(m.get("content") or "").strip()
                    for m in messages))


def rendered_side(template: ChatTemplate, prompt: list, answer: list, where: str) -> str:
    """One side of a pair, marked: the prompt with the generation prompt, then the answer (the
    whole conversation's rendering after it) between ``OPEN`` and ``CLOSE``."""
    check_messages(prompt + answer, where)  # no marks, PAIR among them, in the messages
    before = template.render(prompt, add_generation_prompt=True)
    whole = template.render(prompt + answer)
    if not whole.startswith(before):
        raise InputError(f"{where}: the chat template ({template.name}) renders the prompt "
                         "otherwise than the start of the whole conversation, so the answer "
                         "cannot be cut from it; use a template that renders turn by turn")
    return before + OPEN + whole[len(before):] + CLOSE


def pair_sides(text: str) -> tuple[Side, Side] | None:
    """The chosen and rejected sides of a rendered pair (``PairRenderer``'s text, its marks in),
    or None for a row the renderer left without answers."""
    chosen, _, rejected = text.partition(PAIR)
    if not chosen or not rejected:
        return None
    return _side(chosen), _side(rejected)


def _side(marked: str) -> Side:
    plain, spans = unmarked(marked)
    start = spans[0][0]
    return Side(plain[:start], plain[start:])


class PairRenderer(RowRenderer):
    """The preference reader's renderer: ``text`` the rendered pair. One line names the file and
    the row that lacks the columns or that the template refuses; a row with a missing or empty
    answer only with ``strict``."""

    corpus = "preference"

    def __init__(self, template: ChatTemplate, prompt_column: str, chosen_column: str,
                 rejected_column: str, strict: bool):
        self.template, self.strict = template, strict
        self.columns = (prompt_column, chosen_column, rejected_column)

    def render_row(self, row, where: str) -> str:
        parts = split_prompt(row, *self.columns) if isinstance(row, dict) else None
        if parts is None:
            if self.strict or not isinstance(row, dict):
                prompt, chosen, rejected = self.columns
                raise InputError(f"{where} has no {prompt} with a non-empty {chosen} and "
                                 f"{rejected} (nor two whole conversations); fix the row, or "
                                 "name its fields with data.prompt_column, data.chosen_column "
                                 "and data.rejected_column")
            return PAIR  # counted and skipped by the encoder
        prompt, chosen, rejected = parts
        return (rendered_side(self.template, prompt, chosen, where) + PAIR
                + rendered_side(self.template, prompt, rejected, where))
