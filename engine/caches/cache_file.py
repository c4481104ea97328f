"""The disk cache's file format: one sequence state per file (pure Python, no llama.cpp).

Layout: ``b"LLSC"``, u32 format version, u32 header length, JSON header
``{key, n_tokens, state_bytes, snapshots, crc32}``, int32 tokens, the state bytes
(``llama_state_seq_get_data``), then the snapshot bytes (recurrent / hybrid models: the
recurrent state at earlier positions, ``snapshots`` = ``[[position, bytes], ...]`` in file
order; see ``engine.caches.snapshots``). The CRC covers tokens, state and snapshots.

``key`` is ``compat_key``: everything a saved state depends on (the model file, the
llama.cpp build, the KV layout, the adapters), so a file of another model or build is
recognised as such and never served. The store around the files (index, eviction,
locking, the background writer) is ``engine.caches.disk_cache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from array import array
from io import BufferedReader
from typing import Any

MAGIC = b"LLSC"
FORMAT_VERSION = 2  # 2: snapshots after the state
SUFFIX = ".lsc"
PREAMBLE = struct.Struct("<4sII")
MAX_HEADER = 1 << 16
_SAMPLE = 1 << 16

Snapshots = tuple[tuple[int, bytes], ...]  # (position, recurrent-state bytes), in order


class Corrupt(Exception):
    """The file cannot be what any llamaserve wrote (or it was damaged since)."""


def model_fingerprint(path: str) -> dict[str, Any]:
    """Size plus a SHA-256 over the GGUF header region, the tail and 64 evenly spaced
    64 KiB samples: changes with any re-quantization or different weights, yet costs a
    few MB of reading instead of hashing a multi-GB file at every start."""
    size = os.path.getsize(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(8 << 20))
        for i in range(64):
            f.seek(size * i // 64)
            h.update(f.read(_SAMPLE))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read())
    return {"size": size, "sampled_sha256": h.hexdigest()}


def compat_key(model_path: str, layout: dict[str, Any]) -> str:
    """Everything a saved sequence state depends on, hashed: the model file, the
    llama.cpp build, the KV layout settings and the loaded adapters (``layout``)."""
    fields = {"format": FORMAT_VERSION, "model": model_fingerprint(model_path), **layout}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def tokens_bytes(tokens: list[int]) -> bytes:
    arr = array("i", tokens)
    if arr.itemsize != 4:  # pragma: no cover - every supported platform has 32-bit int
        raise RuntimeError("array('i') is not 32-bit here")
    return arr.tobytes()


def file_name(key: str, tokens: list[int]) -> str:
    return hashlib.sha256(key.encode() + tokens_bytes(tokens)).hexdigest()[:40] + SUFFIX


def read_header(f: BufferedReader, key: str) -> dict[str, Any] | None:
    """Parse and check a file's header (``f`` at its start); None when it belongs to
    another model / build / layout. Raises Corrupt when it cannot be what any llamaserve
    wrote, or the file's size is not what the header says."""
    pre = f.read(PREAMBLE.size)
    if len(pre) != PREAMBLE.size:
        raise Corrupt("short preamble")
    magic, version, header_len = PREAMBLE.unpack(pre)
    if magic != MAGIC or header_len > MAX_HEADER:
        raise Corrupt("bad magic")
    header: dict[str, Any] = json.loads(f.read(header_len))
    if version != FORMAT_VERSION or header.get("key") != key:
        return None
    snaps = header.setdefault("snapshots", [])
    if not all(isinstance(e, list) and len(e) == 2 and 0 < e[0] < header["n_tokens"]
               and e[1] > 0 for e in snaps):
        raise Corrupt("bad snapshot table")
    expected = PREAMBLE.size + header_len + 4 * header["n_tokens"] + header["state_bytes"] \
        + sum(e[1] for e in snaps)
    if os.fstat(f.fileno()).st_size != expected:
        raise Corrupt("truncated")
    return header


def read_tokens(f: BufferedReader, header: dict[str, Any]) -> list[int]:
    """The token ids (``f`` right after the header)."""
    tokens = array("i")
    tokens.frombytes(f.read(4 * header["n_tokens"]))
    return tokens.tolist()


def read_body(f: BufferedReader, header: dict[str, Any], tokens: list[int]
              ) -> tuple[bytearray, dict[int, bytes]]:
    """The state bytes and the snapshots (position -> bytes), ``f`` right after the header;
    raises Corrupt on a short file, a CRC mismatch or tokens other than ``tokens``."""
    table = [(int(p), int(k)) for p, k in header["snapshots"]]
    body = bytearray(4 * header["n_tokens"] + header["state_bytes"] + sum(k for _, k in table))
    if f.readinto(body) != len(body):
        raise Corrupt("truncated")
    if zlib.crc32(body) != header["crc32"]:
        raise Corrupt("checksum mismatch")
    split = 4 * header["n_tokens"]
    if bytes(body[:split]) != tokens_bytes(tokens):
        raise Corrupt("tokens differ from the index")
    snapshots: dict[int, bytes] = {}
    at = split + header["state_bytes"]
    for pos, k in table:
        snapshots[pos] = bytes(body[at : at + k])
        at += k
    del body[split + header["state_bytes"]:]
    del body[:split]
    return body, snapshots


def encode(key: str, tokens: list[int], state: bytearray, snapshots: Snapshots = ()
           ) -> list[bytes | bytearray]:
    """The file's bytes, in the order they are written (the state is not copied)."""
    tok = tokens_bytes(tokens)
    crc = zlib.crc32(state, zlib.crc32(tok))
    for _, data in snapshots:
        crc = zlib.crc32(data, crc)
    header = json.dumps({"key": key, "n_tokens": len(tokens), "state_bytes": len(state),
                         "snapshots": [[p, len(d)] for p, d in snapshots],
                         "crc32": crc}).encode()
    return [PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header)), header, tok, state,
            *(data for _, data in snapshots)]
