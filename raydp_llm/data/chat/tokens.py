"""A chat stream's stored tokens (``data.format=chat``): each a uint32 word, the token id in the
low 30 bits, bit 31 set where the loss counts the token (a target the model learns), bit 30 set
where a conversation starts (positions restart there and attention does not cross it). The flags
travel with the ids through every stage (chunks, halos, windows) at no cost in code; a stream
whose tokenizer would store 2 bytes per token pays 2 more (the manifest says so).

The ETL packs the conversations into *records* of ``block_size + 1`` tokens, each starting with a
conversation (padding, a conversation of its own that nothing learns, fills the rest); a window is
one record (stride ``block_size + 1``), so no conversation is ever cut by a window."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

DTYPE = np.dtype(np.uint32)
TRAIN = np.uint32(1 << 31)  # the loss counts this token
START = np.uint32(1 << 30)  # a conversation (or the padding) starts here
ID = np.uint32((1 << 30) - 1)  # the token id's bits


class Unpacked(NamedTuple):
    ids: np.ndarray  # the token ids
    train: np.ndarray  # bool: the loss counts the token
    start: np.ndarray  # bool: a conversation starts at the token


def pack(ids: np.ndarray, train: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Token ids and their two flags (bool arrays of the same shape) as stored words."""
    words = ids.astype(DTYPE)
    words |= np.where(train, TRAIN, np.uint32(0))
    words |= np.where(start, START, np.uint32(0))
    return words


def unpack(words: np.ndarray) -> Unpacked:
    words = words.astype(DTYPE, copy=False)
    return Unpacked((words & ID).astype(np.int64), (words & TRAIN) != 0, (words & START) != 0)
