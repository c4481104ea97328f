"""A GGUF file's header, read in Python: its tensor table, and the values of a small tensor.

llama.cpp reads the whole file when it loads a model. This reads the header only, skipping
over metadata values, so a file can be checked before it is handed over
(``engine.model_source.check_gguf``), and a small tensor llama.cpp does not expose can be
read (a reranker's classification rows, ``engine.embeddings.last_token``).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

# GGUF value types with a fixed size (struct format); 8 is a string, 9 an array
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
          12: "d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
MAX_NESTING = 16  # arrays of arrays: GGUF files use one level


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


class _Cursor:
    """Reads values from ``buf`` (the mapped file) at ``pos``; past ``end`` is ``Truncated``."""

    def __init__(self, buf: mmap.mmap | bytes) -> None:
        self.buf, self.pos, self.end = buf, 0, len(buf)

    def read(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > self.end:
            raise Truncated
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise Truncated
        self.pos += n

    def string(self, limit: int = 1 << 16) -> str | None:
        """A string value; None (skipped) when it is longer than ``limit`` bytes."""
        n = self.read("Q")
        if n > limit:
            self.skip(n)
            return None
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """``count`` strings in a row (a vocabulary: ~150,000 of them), in one tight loop."""
        buf, pos, end, length = self.buf, self.pos, self.end, _U64.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise Truncated
            pos += 8 + length(buf, pos)[0]
        if pos > end:
            raise Truncated
        self.pos = pos

    def skip_value(self, kind: int, depth: int = 0) -> None:
        if depth > MAX_NESTING:  # (each level costs 12 bytes: a file could recurse deep)
            raise ValueError(f"arrays nested over {MAX_NESTING} deep")
        if kind in _FIXED:
            self.skip(struct.calcsize("<" + _FIXED[kind]))
        elif kind == _STRING:
            self.skip(self.read("Q"))
        elif kind == _ARRAY:
            item, count = self.read("I"), self.read("Q")
            if item in _FIXED:
                self.skip(count * struct.calcsize("<" + _FIXED[item]))
            elif item == _STRING:
                self.skip_strings(count)
            else:
                for _ in range(count):
                    self.skip_value(item, depth + 1)
        else:
            raise ValueError(f"unknown value type {kind}")


def read_header(path: str) -> Header:
    """The header of a GGUF file. Raises ``NotGguf``, ``UnsupportedVersion``, ``Truncated``,
    ``ValueError`` or ``struct.error`` (a malformed header) and ``OSError``."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 4:
            raise NotGguf(f"it starts with {f.read(4)!r}, not b'GGUF'")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf))


def _parse(c: _Cursor) -> Header:
    magic = bytes(c.buf[:4])
    if magic != b"GGUF":
        raise NotGguf(f"it starts with {magic!r}, not b'GGUF'")
    c.pos = 4
    version = c.read("I")
    if version not in (2, 3):
        raise UnsupportedVersion(f"unsupported GGUF version {version}")
    n_tensors, n_kv = c.read("Q"), c.read("Q")
    metadata: dict[str, int | float | bool | str] = {}
    for _ in range(n_kv):
        key = c.string() or ""
        kind = c.read("I")
        if kind in _FIXED:
            metadata[key] = c.read(_FIXED[kind])
        elif kind == _STRING:
            text = c.string()
            if text is not None:
                metadata[key] = text
        else:
            c.skip_value(kind)
    table = []
    for _ in range(n_tensors):
        name = c.string() or ""
        dims = tuple(c.read("Q") for _ in range(c.read("I")))
        table.append((name, dims, c.read("I"), c.read("Q")))
    alignment = metadata.get("general.alignment")
    align = alignment if isinstance(alignment, int) and alignment > 0 else 32
    start = -(-c.pos // align) * align
    tensors = {name: TensorInfo(name, dims, kind, start + offset)
               for name, dims, kind, offset in table}
    if any(t.offset >= c.end for t in tensors.values()):
        raise Truncated
    return Header(version, c.end, metadata, tensors)


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
