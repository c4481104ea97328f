"""Disk-cache faults: a full disk (injected ENOSPC and a real 256 KiB tmpfs), a read-only
cache directory, a process killed mid-write (short version of bench/kill9.py) — saves are
skipped and counted, nothing half-written is ever used, requests never fail."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import engine.caches.disk_cache as disk_cache
import kill9
from conftest import gemma_config, start_server
from engine.caches.disk_cache import SUFFIX, DiskCache
from engine.config import DiskCacheConfig
from engine.metrics import EngineMetrics


def cache(path: Path, metrics: EngineMetrics, max_bytes: int = 64 << 20) -> DiskCache:
    return DiskCache(DiskCacheConfig(path=str(path), max_bytes=max_bytes, min_tokens=4),
                     key="k", metrics=metrics)


def errors(metrics: EngineMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("llamaserve_disk_cache_write_errors_total",
                                              {"reason": reason})
    return value or 0.0


def listing(path: Path) -> list[str]:
    """Everything in the directory but the lock file replicas share."""
    return sorted(p.name for p in path.iterdir() if p.name != ".lock")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real size-limited filesystem (needs root and mount); skipped where unavailable."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (the injected-ENOSPC test covers the logic)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_injected_enospc_is_counted_backs_off_and_leaves_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = EngineMetrics()
    d = cache(tmp_path, metrics)

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_cache.os, "fsync", full)
    d.put([1, 2, 3, 4], bytearray(b"x" * 1000))
    d.flush()
    assert errors(metrics, "ENOSPC") == 1
    assert listing(tmp_path) == []  # the partial temp file is gone
    assert not d.wants([5, 6, 7, 8, 9])  # backing off: not even copied out of llama.cpp
    assert errors(metrics, "skipped") == 1
    # the disk has room again and the back-off is over: saves resume
    monkeypatch.undo()
    d._failing_until = 0.0
    assert d.wants([5, 6, 7, 8, 9])
    d.put([5, 6, 7, 8, 9], bytearray(b"y" * 1000))
    d.flush()
    assert len(d) == 1 and d.read(d.lookup([5, 6, 7, 8, 9, 1])[0][1], [5, 6, 7, 8, 9])
    d.close()


def test_real_full_disk(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "256k") as path:
        metrics = EngineMetrics()
        d = cache(path, metrics)
        for i in range(4):  # 100 KB each: the third does not fit
            d._failing_until = 0.0
            d.put([i, 1, 2, 3, 4], bytearray(os.urandom(100_000)))
            d.flush()
        assert errors(metrics, "ENOSPC") >= 1
        assert not [n for n in listing(path) if n.startswith(".tmp-")]
        stored = 0
        for i in range(4):  # what was written is whole and readable
            for _, name in d.lookup([i, 1, 2, 3, 4, 5]):
                assert d.read(name, [i, 1, 2, 3, 4]) is not None
                stored += 1
        assert 1 <= stored == len(d) <= 2
        d.close()


def test_read_only_directory_serves_what_it_has_and_skips_saves(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m") as path:
        d = cache(path, EngineMetrics())
        d.put([1, 2, 3, 4], bytearray(b"state"))
        d.close()
        (path / ".tmp-leftover").write_bytes(b"half")
        (path / ("0" * 40 + SUFFIX)).write_bytes(b"garbage")
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        metrics = EngineMetrics()
        d = cache(path, metrics)  # starts: cannot delete the leftovers, does not care
        hits = d.lookup([1, 2, 3, 4, 5])
        assert [n for n, _ in hits] == [4]
        assert d.read(hits[0][1], [1, 2, 3, 4]) == bytearray(b"state")
        d.put([7, 8, 9, 10], bytearray(b"new"))
        d.flush()
        assert errors(metrics, "EROFS") == 1
        assert not d.wants([11, 12, 13, 14])
        d.close()


def test_unusable_directory_does_not_stop_the_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    metrics = EngineMetrics()
    d = cache(blocker / "cache", metrics)  # mkdir fails: ENOTDIR
    assert d.lookup([1, 2, 3, 4, 5]) == []
    d.put([1, 2, 3, 4], bytearray(b"x"))
    d.flush()
    assert errors(metrics, "ENOTDIR") == 1
    d.close()


def test_kill_9_while_writing_never_leaves_a_usable_partial_file(tmp_path: Path) -> None:
    """Short run of bench/kill9.py: every restart is healthy, the cache stays within
    max_bytes, no temp file survives a start, and cached answers equal the first one."""
    report = kill9.run(2, tmp_path, seed=1)
    assert report.problems == [] and report.mismatches == 0
    assert report.started == 3 and report.rejected == 0
    assert report.max_seen_bytes <= kill9.MAX_BYTES


def test_server_on_a_full_then_read_only_disk_serves_every_request(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "1m") as path:
        cfg = gemma_config(n_seq_max=4, max_output_tokens=4)
        cfg["disk_cache"] = {"path": str(path), "min_tokens": 32}
        server = start_server(cfg, tmp_path)
        try:
            url = server.base_url + "/completions"
            statuses = []
            for i in range(4):
                r = httpx.post(url, json={"prompt": kill9.prompt(i), "max_tokens": 2},
                               timeout=120)
                statuses.append(r.status_code)
                time.sleep(0.3)
            m = server.metrics()
            assert m.get("llamaserve_disk_cache_write_errors_total{reason=ENOSPC}", 0) >= 1
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
            time.sleep(kill9_backoff() + 0.5)
            for i in range(4, 8):
                r = httpx.post(url, json={"prompt": kill9.prompt(i), "max_tokens": 2},
                               timeout=120)
                statuses.append(r.status_code)
                time.sleep(0.3)
            assert statuses == [200] * 8
            m = server.metrics()
            assert m.get("llamaserve_disk_cache_write_errors_total{reason=EROFS}", 0) >= 1
            assert m.get("llamaserve_disk_cache_write_errors_total{reason=skipped}", 0) >= 1
            assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        finally:
            server.stop()


def kill9_backoff() -> float:
    return disk_cache.WRITE_BACKOFF
