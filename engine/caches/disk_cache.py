"""Sequence states on disk, so a long shared prefix survives restarts and evictions.

One file per entry: the token ids and the ``llama_state_seq_get_data`` bytes of a
sequence that held exactly those tokens, behind a header with a compatibility
key and a CRC. The engine thread serializes the state (a memory copy) and hands
it to a background writer that writes a temporary file and renames it into
place, so a crash mid-write never leaves a half file under a real name. Entries
are indexed in a radix tree; a lookup returns only stored token sequences that
are a true prefix of the request. Corrupt files are deleted and counted; files
from another model, llama.cpp build or KV layout are counted, never served, and
evicted like any other file. Total size stays under ``max_bytes``, least
recently used first (use is recorded in the file's mtime, so the order survives
restarts and is shared between processes).

Several processes may share one directory (replicas on shared storage): writes
and evictions take an exclusive ``flock`` on ``.lock`` and re-read the
directory first, and every process notices the others' new and removed files
(the directory's mtime changes), so a prefix one replica saved is a hit on all.

The file format is ``engine.caches.cache_file``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Any

from engine.caches.cache_file import (
    SUFFIX,
    Corrupt,
    compat_key,
    encode,
    file_name,
    read_body,
    read_header,
    read_tokens,
)
from engine.caches.prefix_tree import PrefixTree
from engine.config import DiskCacheConfig
from engine.metrics import EngineMetrics

log = logging.getLogger("llamaserve.disk_cache")

__all__ = ["SUFFIX", "DiskCache", "compat_key"]  # (the format's names tests and the engine use)

@dataclass
class _Entry:
    name: str
    n_tokens: int
    size: int
    last_used: float
    snapshots: tuple[int, ...] = ()  # positions of the recurrent-state snapshots stored


def _job_size(tokens: list[int], state: bytearray,
              snapshots: tuple[tuple[int, bytes], ...]) -> int:
    return len(state) + sum(len(d) for _, d in snapshots) + 4 * len(tokens) + 1024


WRITE_BACKOFF = 10.0  # seconds saves are skipped after a failed write
REFRESH_INTERVAL = 0.2  # seconds between checks for other processes' changes
FULL_REFRESH = 5.0  # seconds after which the directory is re-read even if it looks unchanged
LOCK_NAME = ".lock"


def _unlink(path: Path) -> None:
    """Delete if possible: a read-only directory must not fail a request."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


class DiskCache:
    def __init__(self, cfg: DiskCacheConfig, key: str, metrics: EngineMetrics | None = None,
                 max_pending_bytes: int = 512 << 20) -> None:
        self.dir = Path(cfg.path)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # serve without it: every save is skipped and counted
            log.warning("disk cache %s unusable (%s); saves will be skipped", self.dir,
                        exc.strerror or exc)
        self.max_bytes = cfg.max_bytes
        self.min_tokens = cfg.min_tokens
        self.key = key
        self.metrics = metrics or EngineMetrics()
        self._max_pending = max_pending_bytes
        self._pending = 0
        self._lock = threading.Lock()
        self._tree: PrefixTree[str] = PrefixTree()
        self._entries: dict[str, _Entry] = {}
        self._foreign: dict[str, _Entry] = {}  # other models' / builds' files (shared dir)
        self._queued: PrefixTree[str] = PrefixTree()  # saves not written yet
        self._queue: queue.Queue[tuple[str, list[int], bytearray,
                                       tuple[tuple[int, bytes], ...]] | None] = queue.Queue()
        self._failing_until = 0.0  # after a failed write, saves are skipped until then
        self._dir_mtime = -1
        self._next_check = 0.0
        self._refreshed_at = 0.0
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="llamaserve-disk-cache",
                                        daemon=True)
        self._writer.start()

    # -- sharing the directory ----------------------------------------------------------
    # Several processes (replicas on shared storage) may use one directory at once. Writes
    # and evictions happen under an exclusive ``flock`` on ``.lock``, after re-reading the
    # directory, so the total stays under ``max_bytes`` across all of them and a temporary
    # file seen while holding the lock belongs to a writer that died. Readers take no lock:
    # files appear only by an atomic rename, and a file another process removed is a miss.
    @contextlib.contextmanager
    def _dir_lock(self) -> Iterator[None]:
        try:
            fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # read-only or missing directory: nothing will be written anyway
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _scan(self) -> None:
        with self._dir_lock():
            try:
                names = [p.name for p in self.dir.iterdir()]
            except OSError as exc:
                log.warning("disk cache %s: cannot list (%s)", self.dir, exc.strerror or exc)
                names = []
            for name in names:
                if name.startswith(".tmp-"):
                    _unlink(self.dir / name)  # a write that never finished (killed mid-write)
            self._refresh()
            self._evict()
        log.info("disk cache %s: %d entries, %d bytes", self.dir, len(self._entries),
                 self.total_bytes)

    def _refresh(self) -> None:
        """Bring the index in line with the directory: files other processes wrote are
        indexed, files they removed are forgotten, use times come from the files' mtimes."""
        self._refreshed_at = time.monotonic()
        try:
            self._dir_mtime = os.stat(self.dir).st_mtime_ns
            with os.scandir(self.dir) as it:
                listing = {e.name: e for e in it
                           if e.name.endswith(SUFFIX) and not e.name.startswith(".")}
        except OSError:
            return
        with self._lock:
            for known in (self._entries, self._foreign):
                for name in [n for n in known if n not in listing]:
                    self._tree.remove(name)
                    del known[name]
        for name, item in listing.items():
            try:
                st = item.stat()
            except OSError:  # removed meanwhile
                continue
            with self._lock:
                entry = self._entries.get(name) or self._foreign.get(name)
                if entry is not None:
                    entry.size, entry.last_used = st.st_size, max(entry.last_used, st.st_mtime)
                    continue
            self._index(self.dir / name, st)
        with self._lock:
            self._update_gauges()

    def _maybe_refresh(self) -> None:
        """Re-read the directory when it changed, checked at most every REFRESH_INTERVAL.
        A directory mtime within the last two seconds is not trusted (timestamps are
        coarse: two changes in one tick leave one mtime), nor one older than
        FULL_REFRESH (a network filesystem may cache attributes)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + REFRESH_INTERVAL
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except OSError:
            return
        if mtime != self._dir_mtime or time.time() - mtime / 1e9 < 2.0 \
                or now - self._refreshed_at > FULL_REFRESH:
            self._refresh()

    def _index(self, path: Path, st: os.stat_result) -> None:
        try:
            with open(path, "rb") as f:
                header = self._read_header(f)
                if header is None:  # another model's or build's: evicted like any file
                    with self._lock:
                        self._foreign[path.name] = _Entry(path.name, 0, st.st_size, st.st_mtime)
                    return
                tokens = read_tokens(f, header)
            with self._lock:
                self._add(path.name, tokens, st.st_size, st.st_mtime,
                          tuple(e[0] for e in header["snapshots"]))
        except FileNotFoundError:
            return
        except (OSError, Corrupt, ValueError, KeyError, TypeError) as exc:
            self._reject(path, "corrupt", exc)

    def _read_header(self, f: BufferedReader) -> dict[str, Any] | None:
        """``cache_file.read_header``, counting another model's or build's file."""
        header = read_header(f, self.key)
        if header is None:
            self.metrics.disk_rejected.labels("incompatible").inc()
        return header

    def _add(self, name: str, tokens: list[int], size: int, last_used: float,
             snapshots: tuple[int, ...] = ()) -> None:
        """Index an entry (caller holds ``_lock``)."""
        if name in self._entries:
            return
        self._tree.insert(name, tokens)
        self._entries[name] = _Entry(name, len(tokens), size, last_used, snapshots)
        self._update_gauges()

    def _drop(self, name: str) -> None:
        """Delete an entry or a foreign file (caller holds ``_lock``)."""
        self._tree.remove(name)
        self._entries.pop(name, None)
        self._foreign.pop(name, None)
        _unlink(self.dir / name)
        self._update_gauges()

    def _reject(self, path: Path, reason: str, exc: Exception | None) -> None:
        log.warning("disk cache: deleting %s file %s%s", reason, path.name,
                    f" ({exc})" if exc else "")
        self.metrics.disk_rejected.labels(reason).inc()
        with self._lock:
            self._tree.remove(path.name)
            self._entries.pop(path.name, None)
            self._update_gauges()
        _unlink(path)

    def discard(self, name: str, reason: str) -> None:
        self._reject(self.dir / name, reason, None)

    def _evict(self, reserve: int = 0) -> None:
        """Least recently used first (this model's entries and foreign files alike), until
        the directory (and ``reserve`` bytes about to be written) fits in ``max_bytes``.
        Called under the directory lock, after a refresh, so the sum covers every process."""
        with self._lock:
            while self._dir_bytes() + reserve > self.max_bytes and \
                    (self._entries or self._foreign):
                oldest = min((*self._entries.values(), *self._foreign.values()),
                             key=lambda e: e.last_used)
                self._drop(oldest.name)
                self.metrics.disk_evictions.inc()

    def _dir_bytes(self) -> int:
        return self.total_bytes + sum(e.size for e in self._foreign.values())

    def _update_gauges(self) -> None:
        self.metrics.disk_entries.set(len(self._entries))
        self.metrics.disk_bytes.set(self.total_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    # -- lookups (engine thread) ------------------------------------------------------------
    def lookup(self, tokens: list[int]) -> list[tuple[int, str]]:
        """Stored entries that are a true prefix of ``tokens``: (length, name), longest first."""
        self._maybe_refresh()
        with self._lock:
            return [(n, name) for n, name in self._tree.stored_prefixes(tokens) if n > 0]

    def sharing(self, tokens: list[int]) -> list[tuple[int, str, list[int]]]:
        """Stored entries sharing a prefix with ``tokens`` (a true prefix or one that then
        diverges): (shared length, name, the entry's tokens), most shared first and, among
        equals, the shortest to load."""
        self._maybe_refresh()
        with self._lock:
            found = [(n, name, self._tree.tokens(name))
                     for name, n in self._tree.common_prefixes(tokens).items() if n > 0]
        found.sort(key=lambda e: (-e[0], len(e[2])))
        return found

    def wants(self, tokens: list[int], min_new: int | None = None) -> bool:
        """Worth saving: long enough, and at least ``min_new`` (default ``min_tokens``)
        tokens past any stored prefix. Not while writes are failing (disk full, read-only):
        those saves are skipped and counted, and the state is not even copied out of
        llama.cpp."""
        if len(tokens) < self.min_tokens:
            return False
        if time.monotonic() < self._failing_until:
            self.metrics.disk_write_errors.labels("skipped").inc()
            return False
        self._maybe_refresh()
        with self._lock:
            longest = max((n for n, _ in [*self._tree.stored_prefixes(tokens),
                                          *self._queued.stored_prefixes(tokens)]), default=0)
        return len(tokens) - longest >= (self.min_tokens if min_new is None else min_new)

    def snapshot_positions(self, name: str) -> tuple[int, ...]:
        """Positions of the recurrent-state snapshots stored with entry ``name``."""
        with self._lock:
            entry = self._entries.get(name)
            return entry.snapshots if entry is not None else ()

    def read(self, name: str, tokens: list[int]) -> bytearray | None:
        """The state bytes of entry ``name`` (which must hold ``tokens``), or None when the
        file is gone or damaged (then it is deleted and counted)."""
        got = self.read_entry(name, tokens)
        return None if got is None else got[0]

    def read_entry(self, name: str, tokens: list[int]
                   ) -> tuple[bytearray, dict[int, bytes]] | None:
        """``read`` with the snapshots stored with the entry (position -> bytes)."""
        path = self.dir / name
        try:
            with open(path, "rb") as f:
                header = self._read_header(f)
                if header is None:
                    return None
                state, snapshots = read_body(f, header, tokens)
        except FileNotFoundError:
            with self._lock:
                self._tree.remove(name)
                self._entries.pop(name, None)
            return None
        except (OSError, Corrupt, ValueError, KeyError, TypeError) as exc:
            self._reject(path, "corrupt", exc)
            return None
        now = time.time()
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None:
                entry.last_used = now
        with contextlib.suppress(OSError):
            os.utime(path, (now, now))
        return state, snapshots

    def hit(self) -> None:
        self.metrics.disk_hits.inc()

    # -- writing (background thread) --------------------------------------------------------
    def put(self, tokens: list[int], state: bytearray,
            snapshots: tuple[tuple[int, bytes], ...] = ()) -> None:
        """Queue a save (with recurrent-state snapshots at earlier positions); dropped (and
        counted) when the writer is too far behind."""
        size = _job_size(tokens, state, snapshots)
        with self._lock:
            if size > self.max_bytes or self._pending + size > self._max_pending:
                self.metrics.disk_dropped.inc()
                return
            self._pending += size
            name = self._name(tokens)
            self._queued.insert(name, tokens)
        self._queue.put((name, list(tokens), state, snapshots))

    def _write_loop(self) -> None:
        if sys.platform == "linux":  # per-thread nice: copying into the page cache yields to
            with contextlib.suppress(OSError):  # the decode threads on a busy CPU
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                name, tokens, state, snapshots = job
                try:
                    self._write(name, tokens, state, snapshots)
                except OSError as exc:
                    self._write_failed(exc)
                finally:
                    with self._lock:
                        self._pending -= _job_size(tokens, state, snapshots)
                        self._queued.remove(name)
            except Exception:
                log.exception("disk cache write failed")
            finally:
                self._queue.task_done()

    def _write_failed(self, exc: OSError) -> None:
        reason = errno.errorcode.get(exc.errno or 0, "OSError")
        self.metrics.disk_write_errors.labels(reason).inc()
        if time.monotonic() >= self._failing_until:  # one line per back-off period
            log.warning("disk cache write failed (%s: %s); skipping saves for %g s", reason,
                        exc.strerror or exc, WRITE_BACKOFF)
        self._failing_until = time.monotonic() + WRITE_BACKOFF

    def _name(self, tokens: list[int]) -> str:
        return file_name(self.key, tokens)

    def _write(self, name: str, tokens: list[int], state: bytearray,
               snapshots: tuple[tuple[int, bytes], ...] = ()) -> None:
        parts = encode(self.key, tokens, state, snapshots)
        final = self.dir / name
        tmp = self.dir / f".tmp-{name}-{os.getpid()}-{threading.get_ident()}"
        with self._dir_lock():
            self._refresh()
            if name in self._entries:  # another process wrote the same sequence
                return
            # room first, so the directory never holds more than max_bytes, even mid-write
            self._evict(reserve=sum(len(p) for p in parts))
            try:
                with open(tmp, "wb") as f:
                    for part in parts:
                        f.write(part)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            finally:
                _unlink(tmp)
            with self._lock:
                self._add(name, tokens, final.stat().st_size, time.time(),
                          tuple(p for p, _ in snapshots))
            self.metrics.disk_saves.inc()
            self._evict()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until queued saves are on disk."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)
        self._queue.put(None)
        self._writer.join(timeout)
