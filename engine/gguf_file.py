"""A GGUF file's header, read in Python: its tensor table, and the values of a small tensor.

llama.cpp reads the whole file when it loads a model. This reads the header only, seeking
over metadata values, so a file can be checked before it is handed over
(``engine.model_source.check_gguf``), and a small tensor llama.cpp does not expose can be
read (a reranker's classification rows, ``engine.embeddings.last_token``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

# GGUF value types with a fixed size (struct format); 8 is a string, 9 an array
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
          12: "d"}
_STRING, _ARRAY = 8, 9


class Truncated(Exception):
    """The header or the tensor data runs past the end of the file."""


class NotGguf(ValueError):
    """The file does not start with GGUF's magic."""


class UnsupportedVersion(ValueError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml's ne: the fastest-moving dimension first
    type: int  # ggml_type
    offset: int  # of its data, from the start of the file


@dataclass(frozen=True)
class Header:
    version: int
    size: int  # of the file, in bytes
    metadata: dict[str, int | float | bool | str]  # scalars and strings; arrays are skipped
    tensors: dict[str, TensorInfo]


def _read(f: BinaryIO, fmt: str) -> int:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise Truncated
    value: int = struct.unpack("<" + fmt, data)[0]
    return value


def _skip(f: BinaryIO, n: int, end: int) -> None:
    if f.tell() + n > end:
        raise Truncated
    f.seek(n, os.SEEK_CUR)


def _string(f: BinaryIO, end: int, limit: int = 1 << 16) -> str | None:
    """A string value; None (skipped) when it is longer than ``limit`` bytes."""
    n = _read(f, "Q")
    if n > limit:
        _skip(f, n, end)
        return None
    data = f.read(n)
    if len(data) != n:
        raise Truncated
    return data.decode("utf-8", errors="replace")


def _skip_value(f: BinaryIO, kind: int, end: int) -> None:
    if kind in _FIXED:
        _skip(f, struct.calcsize("<" + _FIXED[kind]), end)
    elif kind == _STRING:
        _skip(f, _read(f, "Q"), end)
    elif kind == _ARRAY:
        item, count = _read(f, "I"), _read(f, "Q")
        if item in _FIXED:
            _skip(f, count * struct.calcsize("<" + _FIXED[item]), end)
        else:
            for _ in range(count):
                _skip_value(f, item, end)
    else:
        raise ValueError(f"unknown value type {kind}")


def read_header(path: str) -> Header:
    """The header of a GGUF file. Raises ``NotGguf``, ``UnsupportedVersion``, ``Truncated``,
    ``ValueError`` or ``struct.error`` (a malformed header) and ``OSError``."""
    with open(path, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        magic = f.read(4)
        if magic != b"GGUF":
            raise NotGguf(f"it starts with {magic!r}, not b'GGUF'")
        version = _read(f, "I")
        if version not in (2, 3):
            raise UnsupportedVersion(f"unsupported GGUF version {version}")
        n_tensors, n_kv = _read(f, "Q"), _read(f, "Q")
        metadata: dict[str, int | float | bool | str] = {}
        for _ in range(n_kv):
            key = f.read(min(_read(f, "Q"), 1 << 16)).decode("utf-8", errors="replace")
            kind = _read(f, "I")
            if kind in _FIXED:
                metadata[key] = struct.unpack("<" + _FIXED[kind],
                                              f.read(struct.calcsize("<" + _FIXED[kind])))[0]
            elif kind == _STRING:
                text = _string(f, end)
                if text is not None:
                    metadata[key] = text
            else:
                _skip_value(f, kind, end)
        table = []
        for _ in range(n_tensors):
            name = _string(f, end) or ""
            dims = tuple(_read(f, "Q") for _ in range(_read(f, "I")))
            table.append((name, dims, _read(f, "I"), _read(f, "Q")))
        alignment = metadata.get("general.alignment")
        align = alignment if isinstance(alignment, int) and alignment > 0 else 32
        start = -(-f.tell() // align) * align
    tensors = {name: TensorInfo(name, dims, kind, start + offset)
               for name, dims, kind, offset in table}
    if any(t.offset >= end for t in tensors.values()):
        raise Truncated
    return Header(version, end, metadata, tensors)


def read_tensor(path: str, info: TensorInfo) -> np.ndarray:
    """A tensor's values as float32 (dequantized), numpy-shaped (``dims`` reversed: a
    weight is (rows, columns)). Meant for small tensors: it reads the data into memory."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    kind = GGMLQuantizationType(info.type)
    block, type_size = GGML_QUANT_SIZES[kind]
    count = int(np.prod(info.dims)) if info.dims else 1
    if count % block:
        raise ValueError(f"{info.name}: {count} values are not whole blocks of {block}")
    nbytes = count // block * type_size
    with open(path, "rb") as f:
        f.seek(info.offset)
        raw = f.read(nbytes)
    if len(raw) != nbytes:
        raise Truncated
    shape = info.dims[::-1]
    if kind == GGMLQuantizationType.F32:
        return np.frombuffer(raw, np.float32).reshape(shape).copy()
    byte_shape = (*shape[:-1], shape[-1] // block * type_size)
    data = np.frombuffer(raw, np.uint8).reshape(byte_shape)
    return np.asarray(dequantize(data, kind), dtype=np.float32).reshape(shape)
