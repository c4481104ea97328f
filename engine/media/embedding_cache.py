"""Encoded media by content hash: in memory (LRU by bytes) and, if configured, on disk.

A disk entry is one file: a header line (JSON: key, compatibility key, shape, CRC32),
then the float32 rows. Files are written on a background thread to a temporary name
and renamed, so a crash leaves either the whole entry or none; the directory is kept
under ``max_bytes``, least recently used first (reads touch the file's mtime, so the
order survives restarts). A bad file is deleted and counted as a miss, never an error.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from engine.config import EmbeddingCacheConfig

log = logging.getLogger("llamaserve.media_cache")

MAGIC = b"LLAMASERVE-EMBD 1\n"
SUFFIX = ".embd"


class EmbeddingCache:
    def __init__(self, memory_bytes: int, disk: EmbeddingCacheConfig | None,
                 compat: dict[str, Any]) -> None:
        self.memory_bytes = memory_bytes
        self._memory: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self._memory_used = 0
        self.compat = json.dumps(compat, sort_keys=True)
        self.dir = Path(disk.path) if disk is not None else None
        self.max_bytes = disk.max_bytes if disk is not None else 0
        self._files: collections.OrderedDict[str, int] = collections.OrderedDict()  # LRU
        self._lock = threading.Lock()
        self._writer: ThreadPoolExecutor | None = None
        self.hits = {"memory": 0, "disk": 0}
        self.misses = 0
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._scan()
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="llamaserve-media-cache")

    def _scan(self) -> None:
        assert self.dir is not None
        entries = []
        for path in self.dir.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # an interrupted write
            elif path.name.endswith(SUFFIX):
                st = path.stat()
                entries.append((st.st_mtime, path.name, st.st_size))
        for _, name, size in sorted(entries):
            self._files[name] = size

    def _name(self, key: str) -> str:
        return hashlib.sha256(f"{self.compat}\n{key}".encode()).hexdigest()[:40] + SUFFIX

    # -- lookups (engine thread) --------------------------------------------------------
    def get(self, key: str) -> np.ndarray | None:
        rows = self._memory.get(key)
        if rows is not None:
            self._memory.move_to_end(key)
            self.hits["memory"] += 1
            return rows
        rows = self._read(key)
        if rows is None:
            self.misses += 1
            return None
        self.hits["disk"] += 1
        self._remember(key, rows)
        return rows

    def put(self, key: str, rows: np.ndarray) -> None:
        self._remember(key, rows)
        if self._writer is not None and rows.nbytes < self.max_bytes:
            self._writer.submit(self._write, key, rows)

    def _remember(self, key: str, rows: np.ndarray) -> None:
        if rows.nbytes > self.memory_bytes:
            return
        self._memory[key] = rows
        self._memory_used += rows.nbytes
        while self._memory_used > self.memory_bytes:
            _, old = self._memory.popitem(last=False)
            self._memory_used -= old.nbytes

    # -- disk ---------------------------------------------------------------------------
    def _read(self, key: str) -> np.ndarray | None:
        if self.dir is None:
            return None
        name = self._name(key)
        with self._lock:
            if name not in self._files:
                return None
        path = self.dir / name
        try:
            with open(path, "rb") as f:
                if f.readline() != MAGIC:
                    raise ValueError("bad magic")
                header = json.loads(f.readline())
                if header.get("key") != key or header.get("compat") != self.compat:
                    raise ValueError("key mismatch")
                shape = (int(header["n_tokens"]), int(header["n_embd"]))
                body = f.read()
            if len(body) != 4 * shape[0] * shape[1] or zlib.crc32(body) != header["crc32"]:
                raise ValueError("truncated or corrupt")
            os.utime(path)
            with self._lock:
                self._files.move_to_end(name, last=True)
            return np.frombuffer(body, dtype="<f4").reshape(shape).copy()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("dropping media cache entry %s: %s", name, exc)
            self._delete(name)
            return None

    def _write(self, key: str, rows: np.ndarray) -> None:
        assert self.dir is not None
        name = self._name(key)
        body = np.ascontiguousarray(rows, dtype="<f4").tobytes()
        header = json.dumps({"key": key, "compat": self.compat, "n_tokens": rows.shape[0],
                             "n_embd": rows.shape[1], "crc32": zlib.crc32(body)}).encode()
        size = len(MAGIC) + len(header) + 1 + len(body)
        if size > self.max_bytes:
            return
        try:
            with self._lock:
                if name in self._files:
                    return
                self._make_room(size)
            tmp = self.dir / (name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(MAGIC + header + b"\n" + body)
            os.replace(tmp, self.dir / name)
            with self._lock:
                self._files[name] = size
        except OSError as exc:  # a full disk costs a future hit, nothing else
            log.warning("could not write media cache entry: %s", exc)

    def _make_room(self, size: int) -> None:
        while self._files and sum(self._files.values()) + size > self.max_bytes:
            old, _ = self._files.popitem(last=False)
            assert self.dir is not None
            (self.dir / old).unlink(missing_ok=True)

    def _delete(self, name: str) -> None:
        with self._lock:
            self._files.pop(name, None)
        if self.dir is not None:
            (self.dir / name).unlink(missing_ok=True)

    def flush(self) -> None:
        """Wait for queued writes (tests, shutdown)."""
        if self._writer is not None:
            self._writer.submit(lambda: None).result()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
