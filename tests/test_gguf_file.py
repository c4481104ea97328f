"""The GGUF header reader (``engine.gguf_file``) against the ``gguf`` package's reader on
real files, and on every cut and corruption of a real header: it reads what the file
holds, or raises one of the errors ``engine.model_source.check_gguf`` turns into one
clear line; never anything else, and never a loop that does not end."""

from __future__ import annotations

import contextlib
import random
import struct
from pathlib import Path

import pytest

from conftest import require_model
from engine.gguf_file import NotGguf, Truncated, UnsupportedVersion, read_header

EXPECTED = (Truncated, NotGguf, UnsupportedVersion, ValueError, OverflowError, struct.error)


def test_header_is_what_the_gguf_package_reads() -> None:
    """(MiniLM: the package reads a 150,000-token vocabulary in ~20 s, MiniLM's in 2.)"""
    from gguf import GGUFReader, GGUFValueType

    path = require_model("minilm")
    header = read_header(path)
    reader = GGUFReader(path)
    tensors = {t.name: (tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset))
               for t in reader.tensors}
    assert {n: (t.dims, t.type, t.offset) for n, t in header.tensors.items()} == tensors
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):  # the reader's own: version and counts
            continue
        if field.types and field.types[0] == GGUFValueType.STRING:
            assert header.metadata[field.name] == field.contents()
        elif field.types and field.types[0] != GGUFValueType.ARRAY:
            assert header.metadata[field.name] == pytest.approx(field.contents())
        else:
            assert field.name not in header.metadata  # arrays are skipped


def test_every_cut_and_corruption_reads_or_raises_a_known_error(tmp_path: Path) -> None:
    path = require_model("minilm")
    header = read_header(path)
    end = min(t.offset for t in header.tensors.values())  # the header and tensor table
    with open(path, "rb") as f:
        data = f.read(end + 64)
    rng = random.Random(0)
    target = tmp_path / "bad.gguf"
    cuts = sorted({rng.randrange(len(data)) for _ in range(150)} | {0, 1, 3, 4, 8, 24})
    cases = [data[:n] for n in cuts]
    for _ in range(250):  # bytes overwritten: counts, lengths and kinds at their worst
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(4, len(bad) - 8)
            bad[at:at + 8] = rng.choice([b"\xff" * 8, b"\x00" * 8, rng.randbytes(8),
                                         struct.pack("<Q", 2 ** 62)])
        cases.append(bytes(bad))
    # arrays of arrays, nested far deeper than the interpreter's recursion limit
    nested = struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + \
        struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0)
    cases.append(nested)
    for case in cases:
        target.write_bytes(case)
        with contextlib.suppress(EXPECTED):
            read_header(str(target))
