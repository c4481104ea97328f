"""Several processes on one disk-cache directory (replicas on shared storage): concurrent
writers, readers and evictors never serve a partial or foreign file, keep the directory
within ``max_bytes`` (plus at most one entry), never crash on a file another process
removed, and see each other's entries. No model: the state bytes are synthetic."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from engine.caches.disk_cache import SUFFIX, DiskCache
from engine.config import DiskCacheConfig

WORKER = Path(__file__).with_name("shared_disk_worker.py")
ENTRY_MAX = 1400 + 4 * 40 + 200  # the largest state the worker writes, its tokens and header


def cache(path: Path, max_bytes: int = 1 << 20) -> DiskCache:
    return DiskCache(DiskCacheConfig(path=str(path), max_bytes=max_bytes, min_tokens=4),
                     key="shared")


def dir_bytes(path: Path) -> int:
    total = 0
    for p in path.iterdir():
        if p.name == ".lock":
            continue
        with contextlib.suppress(FileNotFoundError):  # removed since the listing
            total += p.stat().st_size
    return total


def test_an_entry_saved_by_one_process_is_a_hit_in_another(tmp_path: Path) -> None:
    a, b = cache(tmp_path), cache(tmp_path)  # two flock descriptions, like two processes
    a.put([1, 2, 3, 4, 5, 6], bytearray(b"from-a"))
    assert a.flush()
    time.sleep(0.25)  # b re-reads the directory when its mtime changed
    (hit,) = b.lookup([1, 2, 3, 4, 5, 6, 7])
    assert hit[0] == 6 and b.read(hit[1], [1, 2, 3, 4, 5, 6]) == bytearray(b"from-a")
    assert not b.wants([1, 2, 3, 4, 5, 6, 7])  # already stored by a: no duplicate save
    a.close()
    b.close()


def test_a_file_another_process_evicted_is_a_miss_not_an_error(tmp_path: Path) -> None:
    a, b = cache(tmp_path, max_bytes=2000), cache(tmp_path, max_bytes=2000)
    a.put([1, 2, 3, 4], bytearray(900))
    assert a.flush()
    time.sleep(0.25)
    (hit,) = b.lookup([1, 2, 3, 4, 5])
    a.put([5, 6, 7, 8], bytearray(900))  # no room for both: a evicts the first
    assert a.flush()
    assert b.read(hit[1], [1, 2, 3, 4]) is None
    assert b.metrics.disk_rejected.labels("corrupt")._value.get() == 0
    time.sleep(0.25)
    assert b.lookup([1, 2, 3, 4, 5]) == [] and b.lookup([5, 6, 7, 8, 9])
    a.close()
    b.close()


def test_concurrent_processes_share_one_directory_within_max_bytes(tmp_path: Path) -> None:
    max_bytes = 9000
    seen_max = 0
    stop = threading.Event()

    def monitor() -> None:
        nonlocal seen_max
        while not stop.is_set():
            seen_max = max(seen_max, dir_bytes(tmp_path))
            time.sleep(0.001)

    watcher = threading.Thread(target=monitor)
    watcher.start()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(tmp_path), str(i), "5",
                               str(max_bytes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(4)]
    time.sleep(2.0)
    procs[3].send_signal(signal.SIGKILL)  # one replica dies mid-run, maybe holding the lock
    results = []
    for p in procs[:3]:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    procs[3].wait()
    stop.set()
    watcher.join()
    for r in results:
        assert r["mismatches"] == 0
        assert r["puts"] > 50 and r["hits_from_others"] > 0, r  # the others' saves are hits
    assert sum(r["vanished"] for r in results) >= 0
    assert seen_max <= max_bytes + ENTRY_MAX, seen_max
    names = [p.name for p in tmp_path.iterdir()]
    after = cache(tmp_path, max_bytes=max_bytes)  # a new replica starts: leftovers go
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    assert after.total_bytes <= max_bytes and len(after) == len([n for n in names
                                                                 if n.endswith(SUFFIX)])
    after.close()
