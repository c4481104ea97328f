"""The encoded-media cache: memory LRU by bytes, disk entries that survive a restart,
LRU under max_bytes, atomic files, and bad files dropped (never an error)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.config import EmbeddingCacheConfig
from engine.media.embedding_cache import SUFFIX, EmbeddingCache

COMPAT = {"mmproj": "p.gguf", "size": 1}


def rows(seed: int, n: int = 8, d: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def disk(tmp: Path, max_bytes: int = 1 << 20, compat: dict[str, object] = COMPAT,
         memory: int = 1 << 20) -> EmbeddingCache:
    return EmbeddingCache(memory, EmbeddingCacheConfig(str(tmp), max_bytes), compat)


def test_memory_lru_by_bytes() -> None:
    one = rows(0).nbytes
    cache = EmbeddingCache(2 * one, None, COMPAT)
    for i in range(3):
        cache.put(f"k{i}", rows(i))
    assert cache.get("k0") is None  # the oldest went
    assert np.array_equal(cache.get("k2"), rows(2))  # type: ignore[arg-type]
    assert cache.hits["memory"] == 1 and cache.misses == 1


def test_disk_entries_survive_a_restart_and_keep_lru_order(tmp_path: Path) -> None:
    cache = disk(tmp_path)
    cache.put("a", rows(1))
    cache.put("b", rows(2))
    cache.close()
    assert not list(tmp_path.glob("*.tmp"))
    again = disk(tmp_path)
    got = again.get("a")
    assert got is not None and np.array_equal(got, rows(1)) and again.hits["disk"] == 1
    # another projector (compatibility key) never sees these entries
    other = disk(tmp_path, compat={"mmproj": "q.gguf", "size": 1})
    assert other.get("a") is None


def test_disk_is_kept_under_max_bytes_least_recently_used_first(tmp_path: Path) -> None:
    probe = disk(tmp_path / "probe")
    probe.put("x", rows(0))
    probe.close()
    size = next((tmp_path / "probe").iterdir()).stat().st_size + 8  # one entry's file
    cache = disk(tmp_path / "cache", max_bytes=3 * size, memory=0)
    tmp_path = tmp_path / "cache"
    for key in ("a", "b", "c"):
        cache.put(key, rows(ord(key)))
        cache.flush()
    assert cache.get("a") is not None  # now the most recently used
    cache.put("d", rows(9))
    cache.flush()
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 3 * size
    assert cache.get("b") is None and cache.get("a") is not None
    cache.close()


def test_corrupt_or_truncated_files_are_dropped(tmp_path: Path) -> None:
    cache = disk(tmp_path, memory=0)
    cache.put("a", rows(1))
    cache.put("b", rows(2))
    cache.flush()
    files = sorted(tmp_path.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime)
    data = files[0].read_bytes()
    files[0].write_bytes(data[:-7])  # truncated
    body = bytearray(files[1].read_bytes())
    body[-1] ^= 0xFF  # a flipped bit
    files[1].write_bytes(bytes(body))
    assert cache.get("a") is None and cache.get("b") is None
    assert not list(tmp_path.glob("*" + SUFFIX))  # both deleted
    cache.close()
