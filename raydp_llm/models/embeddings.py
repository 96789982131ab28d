"""Token embeddings from a file (``model.init_embeddings``): a CSV or .npy table of vectors,
checked against the model's vocabulary and width."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from raydp_llm.core.errors import InputError


def read_embeddings(
    path: str, vocab_size: int | None, n_embd: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (N,) and their vectors (N, n_embd) from ``path``, checked against the model.

    A ``.npy`` file holds an array (vocab_size, n_embd), row i for id i, or (rows, 1 + n_embd), the
    id first. Any other file is a CSV, one token per line: the id, then n_embd numbers; the first
    line may be a header. With ``vocab_size`` None (not known before the ETL) only the widths and
    the values are checked.
    """
    npy = str(path).endswith(".npy")
    if npy:
        fix = ("save an array of shape (vocab_size, n_embd) or (rows, 1 + n_embd) with "
               "numpy.save")
    else:
        fix = "write one token per line: id,v1,...,vn (a header line first is allowed)"
    table = _read_table(path, npy, fix)
    ids, vectors = _split_ids(table, path, npy, vocab_size, n_embd, fix)
    _check_ids(ids, path, vocab_size)
    if not np.isfinite(vectors).all():
        raise embeddings_error(path, "vectors hold NaN or infinite values", "give finite numbers")
    return torch.from_numpy(ids.astype(np.int64)), torch.as_tensor(vectors, dtype=torch.float32)


def _read_table(path: str, npy: bool, fix: str) -> np.ndarray:
    """The numbers in ``path`` (a .npy array, else a CSV with an optional header line)."""
    try:
        if npy:
            table = np.load(path, allow_pickle=False)
            if not np.issubdtype(table.dtype, np.number):
                raise ValueError(f"dtype {table.dtype}")
        else:
            with open(path) as f:
                header = not all(_is_number(cell) for cell in f.readline().split(","))
            with warnings.catch_warnings():
                # an empty file: reported below as "no rows"
                warnings.simplefilter("ignore", UserWarning)
                table = np.loadtxt(path, delimiter=",", skiprows=int(header), ndmin=2)
    except ValueError as err:
        problem = f"not a table of numbers ({str(err).split(';')[0]})"
        raise embeddings_error(path, problem, fix) from None
    if table.size == 0:
        raise embeddings_error(path, "no rows", fix)
    return table


def _split_ids(table: np.ndarray, path: str, npy: bool, vocab_size: int | None, n_embd: int,
               fix: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors): row i for id i (a full .npy table), else the first column holds the id."""
    width = table.shape[1] if table.ndim == 2 else None
    if npy and width == n_embd and vocab_size in (None, table.shape[0]):
        return np.arange(table.shape[0]), table
    if width == n_embd + 1:
        return table[:, 0], table[:, 1:]
    if npy:
        full = f"({vocab_size or 'vocab_size'}, {n_embd})"
        raise embeddings_error(path, f"an array of shape {table.shape} is neither (vocab_size, "
                                      f"n_embd) = {full} nor (rows, 1 + n_embd) = (rows, "
                                      f"{n_embd + 1})", fix)
    raise embeddings_error(path, f"rows hold {width - 1} vector values but model.n_embd={n_embd}",
                            "give vectors of n_embd values or change model.n_embd")


def _check_ids(ids: np.ndarray, path: str, vocab_size: int | None) -> None:
    """Integer ids, each once, inside the vocabulary (when its size is known)."""
    if not np.array_equal(ids, np.round(ids)):
        raise embeddings_error(path, f"ids are not integers (e.g. {ids[ids != np.round(ids)][0]})",
                                "put integer token ids in the first column")
    whole = ids.astype(np.int64)
    outside = whole[(whole < 0) | (whole >= (vocab_size or np.iinfo(np.int64).max))]
    if outside.size:
        raise embeddings_error(path, f"ids {outside[:5].tolist()} lie outside [0, "
                                      f"vocab_size={vocab_size})",
                                "use the ids of this run's tokenizer")
    if len(np.unique(whole)) != len(whole):
        raise embeddings_error(
            path, "an id appears on more than one row", "give each token one vector"
        )


def embeddings_error(path: str, problem: str, fix: str) -> InputError:
    return InputError(f"model.init_embeddings={path}: {problem}; {fix}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
