"""A Hugging Face directory's weights read a slice at a time, and written a tensor at a time.

``TensorFiles`` reads the headers of a directory's safetensors (one ``model.safetensors``, or the
shards that ``model.safetensors.index.json`` maps) and then the rows of one tensor that a worker's
shard holds, straight from the file into the shard: only those bytes, nothing mapped, so a worker
never reads (nor holds) the whole model. ``write_safetensors`` writes a file from tensors handed
over one by one: the header first (every name, dtype and shape is known in advance), then each
tensor's bytes as it comes, so the writer holds one tensor at a time, never the whole model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from raydp_llm.core.errors import InputError

INDEX_FILE = "model.safetensors.index.json"  # a model whose weights fill several files
# safetensors' dtype names (its format's specification)
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int8: "I8",
          torch.uint8: "U8", torch.bool: "BOOL"}


@dataclass(frozen=True)
class Stored:
    """Where a tensor lies: its file, dtype, shape and first byte."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int

    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize


@dataclass(frozen=True)
class TensorFiles:
    """The tensors of a directory's safetensors files, by name, read from their headers."""

    directory: Path
    tensors: dict[str, Stored]

    @classmethod
    def of(cls, directory: Path) -> "TensorFiles":
        directory = Path(directory)
        index = directory / INDEX_FILE
        if index.is_file():
            paths = sorted({directory / f for f in
                            json.loads(index.read_text())["weight_map"].values()})
        else:
            paths = sorted(directory.glob("*.safetensors"))
        return cls(directory, {name: stored for path in paths
                               for name, stored in _stored(path).items()})

    def find(self, name: str, prefix: str) -> str | None:
        """The file's name for a model's tensor ``name``: as it is, or without the base model's
        ``prefix`` (GPT-2 files written before transformers kept it)."""
        for candidate in (name, name.removeprefix(prefix + ".")):
            if candidate in self.tensors:
                return candidate
        return None

    def read_rows(self, name: str, start: int, into: torch.Tensor) -> None:
        """``into``'s rows of tensor ``name`` from row ``start`` on (dimension 0; a scalar
        whole), read from the file straight into ``into`` (through a CPU buffer of the file's
        dtype when the dtypes differ or ``into`` is on a GPU): only those bytes are read, nothing
        is mapped."""
        stored = self.tensors[name]
        direct = into.dtype == stored.dtype and into.device.type == "cpu"
        buffer = into if direct else torch.empty(into.shape, dtype=stored.dtype)
        raw = buffer.reshape(-1).view(torch.uint8).numpy()
        with stored.path.open("rb", buffering=0) as f:
            f.seek(stored.begin + start * stored.row_bytes())
            done = 0
            while done < raw.size:  # a read returns at most ~2 GiB
                got = f.readinto(raw[done:])
                if not got:
                    raise InputError(f"{stored.path}: the file ends inside tensor {name}; "
                                     "copy the model again")
                done += got
        if buffer is not into and into.device.type != "cpu":
            # converted on the host: a copy across devices and dtypes at once takes a transient
            # of the tensor's size on the GPU (measured on an H200, docs/benchmarks.md)
            buffer = buffer.to(into.dtype)
        if buffer is not into:
            into.copy_(buffer)


def _stored(path: Path) -> dict[str, Stored]:
    """The tensors a safetensors file's header lists."""
    names = {v: k for k, v in DTYPES.items()}
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return {name: Stored(path, names[entry["dtype"]], tuple(entry["shape"]),
                         8 + size + entry["data_offsets"][0])
            for name, entry in header.items()}


def _header(shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> bytes:
    """The safetensors header of tensors laid out one after another in ``shapes``' order, padded
    with spaces to a multiple of 8 bytes (the format's alignment)."""
    entries, offset = {}, 0
    for name, (dtype, shape) in shapes.items():
        size = math.prod(shape) * dtype.itemsize
        entries[name] = {"dtype": DTYPES[dtype], "shape": list(shape),
                         "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps({"__metadata__": {"format": "pt"}, **entries}).encode()
    return text + b" " * (-len(text) % 8)


def write_safetensors(path: Path, shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                      tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """A safetensors file of the tensors ``shapes`` announces (name → dtype, shape), written as
    ``tensors`` yields them in that order; one held at a time. A tensor other than announced is
    refused (the file would not load)."""
    header = _header(shapes)
    expected = iter(shapes.items())
    with Path(path).open("wb") as out:
        out.write(len(header).to_bytes(8, "little"))
        out.write(header)
        for name, tensor in tensors:
            want_name, (dtype, shape) = next(expected)
            if (name, tensor.dtype, tuple(tensor.shape)) != (want_name, dtype, tuple(shape)):
                raise ValueError(f"{path}: tensor {name} {tensor.dtype} {tuple(tensor.shape)} "
                                 f"written where {want_name} {dtype} {tuple(shape)} was announced")
            out.write(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    if next(expected, None) is not None:
        raise ValueError(f"{path}: fewer tensors written than announced")


def weights_mismatch(directory: Path, what: str) -> InputError:
    """One line: the files' tensors are not the config's model (``what``)."""
    return InputError(f"{directory}: the weights do not fit the model's config.json ({what}); "
                      "give the weights and config of one model together")
