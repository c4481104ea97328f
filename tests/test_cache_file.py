"""engine/caches/cache_file.py with no model: a file written by ``encode`` reads back as
what went in, and every kind of damage is Corrupt, another key None."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.caches.cache_file import Corrupt, encode, read_body, read_header, read_tokens

TOKENS = [1, 2, 3, 500, 151_000]
STATE = bytearray(b"state" * 100)
SNAPS = ((2, b"two" * 10), (4, b"four" * 7))


def write(path: Path, key: str = "k") -> Path:
    path.write_bytes(b"".join(encode(key, TOKENS, STATE, SNAPS)))
    return path


def test_round_trip(tmp_path: Path) -> None:
    with open(write(tmp_path / "a"), "rb") as f:
        header = read_header(f, "k")
        assert header is not None and header["n_tokens"] == len(TOKENS)
        assert read_tokens(f, header) == TOKENS
    with open(tmp_path / "a", "rb") as f:
        header = read_header(f, "k")
        assert header is not None
        state, snaps = read_body(f, header, TOKENS)
    assert state == STATE and snaps == dict(SNAPS)


def test_another_key_is_not_served(tmp_path: Path) -> None:
    with open(write(tmp_path / "a", key="other"), "rb") as f:
        assert read_header(f, "k") is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "tokens"])
def test_damage_is_corrupt(tmp_path: Path, damage: str) -> None:
    path = write(tmp_path / "a")
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        del data[-3:]
    elif damage == "flip":
        data[-1] ^= 0xFF
    elif damage == "magic":
        data[0:4] = b"XXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(Corrupt), open(path, "rb") as f:
        header = read_header(f, "k")
        assert header is not None
        read_body(f, header, TOKENS if damage != "tokens" else [*TOKENS[:-1], 7])
