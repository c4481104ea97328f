"""Disk sequence cache files with no model: format, atomicity, compatibility, eviction."""

from __future__ import annotations

import os
import time
from pathlib import Path

from engine.caches.disk_cache import SUFFIX, DiskCache, compat_key
from engine.config import DiskCacheConfig


def cache(path: Path, key: str = "k", max_bytes: int = 1 << 20, min_tokens: int = 4) -> DiskCache:
    return DiskCache(DiskCacheConfig(path=str(path), max_bytes=max_bytes,
                                     min_tokens=min_tokens), key=key)


def files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.suffix == SUFFIX)


def test_roundtrip_survives_a_restart(tmp_path: Path) -> None:
    d = cache(tmp_path)
    d.put([1, 2, 3, 4, 5], bytearray(b"state-12345"))
    d.close()
    again = cache(tmp_path)
    hits = again.lookup([1, 2, 3, 4, 5, 6, 7])
    assert [n for n, _ in hits] == [5]
    assert again.read(hits[0][1], [1, 2, 3, 4, 5]) == bytearray(b"state-12345")
    assert again.lookup([1, 2, 3, 9, 5, 6]) == []  # shares 3 tokens, then diverges
    assert again.lookup([1, 2, 3, 4]) == []  # shorter than the entry
    again.close()


def test_min_tokens_and_redundant_saves(tmp_path: Path) -> None:
    d = cache(tmp_path, min_tokens=4)
    assert not d.wants([1, 2, 3])
    assert d.wants([1, 2, 3, 4])
    d.put([1, 2, 3, 4], bytearray(b"x"))
    assert not d.wants([1, 2, 3, 4, 5])  # only 1 token past a stored (or queued) prefix
    assert d.wants([1, 2, 3, 4, 5, 6, 7, 8])
    d.close()


def test_files_of_another_model_or_build_are_never_served_and_evicted_first(
        tmp_path: Path) -> None:
    d = cache(tmp_path, key="model-a", max_bytes=2500)
    d.put([1, 2, 3, 4], bytearray(900))
    d.close()
    (theirs,) = files(tmp_path)
    other = cache(tmp_path, key="model-b", max_bytes=2500)  # e.g. a replica of a newer build
    assert len(other) == 0 and other.lookup([1, 2, 3, 4, 5]) == []
    assert files(tmp_path) == [theirs]  # left for its owner while there is room
    assert other.metrics.disk_rejected.labels("incompatible")._value.get() == 1
    other.put([5, 6, 7, 8], bytearray(900))
    assert other.flush() and len(files(tmp_path)) == 2
    other.put([9, 10, 11, 12], bytearray(900))  # no room for three: the oldest file goes
    assert other.flush() and theirs not in files(tmp_path) and len(other) == 2
    other.close()


def test_truncated_file_and_leftover_temp_file_are_removed_at_start(tmp_path: Path) -> None:
    d = cache(tmp_path)
    d.put([1, 2, 3, 4], bytearray(b"0123456789"))
    d.close()
    (f,) = files(tmp_path)
    f.write_bytes(f.read_bytes()[:-3])  # a crash in the middle of a non-atomic write
    (tmp_path / f".tmp-{f.name}-1-1").write_bytes(b"half")
    (tmp_path / "garbage.lsc").write_bytes(b"\x00" * 7)
    again = cache(tmp_path)
    assert len(again) == 0 and [p.name for p in tmp_path.iterdir()] == [".lock"]
    assert again.metrics.disk_rejected.labels("corrupt")._value.get() == 2
    again.close()


def test_flipped_bit_is_detected_on_read(tmp_path: Path) -> None:
    d = cache(tmp_path)
    d.put([1, 2, 3, 4], bytearray(b"0123456789"))
    assert d.flush()
    (f,) = files(tmp_path)
    raw = bytearray(f.read_bytes())
    raw[-2] ^= 0x01
    f.write_bytes(raw)
    (hit,) = d.lookup([1, 2, 3, 4, 5])
    assert d.read(hit[1], [1, 2, 3, 4]) is None
    assert files(tmp_path) == [] and d.lookup([1, 2, 3, 4, 5]) == []
    assert d.metrics.disk_rejected.labels("corrupt")._value.get() == 1
    d.close()


def test_total_size_stays_under_max_bytes_least_recently_used_first(tmp_path: Path) -> None:
    d = cache(tmp_path, max_bytes=3500)
    blob = bytearray(900)
    for start in (10, 20, 30):
        d.put(list(range(start, start + 8)), blob)
        assert d.flush()
        time.sleep(0.01)
    assert len(d) == 3
    (hit,) = d.lookup(list(range(10, 18)))
    assert d.read(hit[1], list(range(10, 18))) is not None  # 10.. is now the most recent
    d.put(list(range(40, 48)), blob)
    assert d.flush()
    assert d.total_bytes <= 3500
    assert sum(p.stat().st_size for p in files(tmp_path)) <= 3500
    assert d.lookup(list(range(20, 28))) == []  # the least recently used went
    assert d.lookup(list(range(10, 18))) and d.lookup(list(range(40, 48)))
    assert d.metrics.disk_evictions._value.get() == 1
    d.close()
    restarted = cache(tmp_path, max_bytes=3500)  # use order survives via mtime
    assert len(restarted) == 3
    restarted.close()


def test_oversized_entry_is_not_written(tmp_path: Path) -> None:
    d = cache(tmp_path, max_bytes=500)
    d.put([1, 2, 3, 4], bytearray(1000))
    assert d.flush() and files(tmp_path) == []
    assert d.metrics.disk_dropped._value.get() == 1
    d.close()


def test_compat_key_covers_model_bytes_and_layout(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(1 << 16))
    layout = {"llama_cpp": "0.3.36", "type_k": None}
    k1 = compat_key(str(model), layout)
    assert k1 == compat_key(str(model), dict(layout))
    assert k1 != compat_key(str(model), {**layout, "type_k": "q8_0"})
    assert k1 != compat_key(str(model), {**layout, "llama_cpp": "0.3.37"})
    raw = bytearray(model.read_bytes())
    raw[100] ^= 0xFF
    model.write_bytes(raw)
    assert k1 != compat_key(str(model), layout)
