"""Stored responses (``previous_response_id``, GET/DELETE /v1/responses/{id}): bounded by
count, bytes and age, least recently stored first.

Two stores behind one async interface:

- ``MemoryResponseStore`` (the default): a dict in this process. Nothing to run.
- ``DirectoryResponseStore`` (``server.responses_store_path``): one JSON file per response
  in a directory that replicas share (the same shared volume as ``disk_cache.path``), so a
  conversation started on one replica continues on any other. Files appear by an atomic
  rename; trimming to the bounds happens under an exclusive ``flock`` on ``.lock``; file
  work runs on a worker thread, never on the event loop. A response is on disk before
  its final event is sent, so the client's next turn finds it wherever it lands.

Why files and not a key-value server such as Redis: the replicas already need shared
storage for the disk cache, a response is written once and read a few times, and a
directory needs no extra service to deploy, secure and keep alive. Redis would be the
better choice for many replicas on many machines without a shared filesystem.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

_SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}")


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the response object as returned (or a conversation object)
    conversation: list[dict[str, Any]]  # chat messages through this response's output
    size: int
    stored_at: float
    items: list[dict[str, Any]] = field(default_factory=list)  # input items (or a
    # conversation's items), as GET .../input_items lists them
    request: dict[str, Any] | None = None  # a background response's request, to resume it


@dataclass
class Claim:
    """A background response this process runs: the lock on its marker file (directory
    store), released when the run ends or the process dies."""
    response_id: str
    fd: int | None = None
    path: Path | None = None


class ResponseStore:
    """The interface both stores implement."""

    can_claim = False  # background responses outlive this process (a directory store)

    async def claim(self, response_id: str) -> Claim | None:
        return Claim(response_id)

    async def release(self, claim: Claim, keep_marker: bool = False) -> None:
        """Let a claim go; ``keep_marker`` leaves the marker for another server to
        resume the run (a shutdown), else the run is done and its marker goes."""
        return None

    async def orphans(self) -> list[Claim]:
        """Background responses whose server died, each now claimed by this process."""
        return []

    async def put(self, response: dict[str, Any], conversation: list[dict[str, Any]],
                  items: list[dict[str, Any]] | None = None,
                  request: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    async def get(self, response_id: str) -> StoredResponse | None:
        raise NotImplementedError

    async def delete(self, response_id: str) -> bool:
        raise NotImplementedError


class MemoryResponseStore(ResponseStore):
    def __init__(self, max_items: int, max_bytes: int, ttl: float) -> None:
        self.max_items, self.max_bytes, self.ttl = max_items, max_bytes, ttl
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    async def put(self, response: dict[str, Any], conversation: list[dict[str, Any]],
                  items: list[dict[str, Any]] | None = None,
                  request: dict[str, Any] | None = None) -> None:
        size = len(json.dumps([response, conversation, items, request]))
        if size > self.max_bytes or self.max_items <= 0:
            return
        self._remove(response["id"])
        self._items[response["id"]] = StoredResponse(response, conversation, size, time.time(),
                                                     items or [], request)
        self._bytes += size
        while len(self._items) > self.max_items or self._bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.size

    async def get(self, response_id: str) -> StoredResponse | None:
        item = self._items.get(response_id)
        if item is not None and self.ttl > 0 and time.time() - item.stored_at > self.ttl:
            self._remove(response_id)
            return None
        return item

    async def delete(self, response_id: str) -> bool:
        return self._remove(response_id)

    def _remove(self, response_id: str) -> bool:
        item = self._items.pop(response_id, None)
        if item is None:
            return False
        self._bytes -= item.size
        return True

    def __len__(self) -> int:
        return len(self._items)


class DirectoryResponseStore(ResponseStore):
    SUFFIX = ".json"
    can_claim = True
    ORPHAN_AGE = 5.0  # a marker younger than this may be its creator's, not yet locked

    def __init__(self, path: str, max_items: int, max_bytes: int, ttl: float) -> None:
        self.dir = Path(path)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.markers = self.dir / ".background"  # made by the first background run
        self.max_items, self.max_bytes, self.ttl = max_items, max_bytes, ttl

    # -- background responses: a marker file locked by the process that runs it ----------
    def _lock(self, path: Path, create: bool) -> int | None:
        try:
            fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    async def claim(self, response_id: str) -> Claim | None:
        if not _SAFE_ID.fullmatch(response_id):
            return None
        path = self.markers / response_id
        await run_in_threadpool(self.markers.mkdir, exist_ok=True)
        fd = await run_in_threadpool(self._lock, path, True)
        return None if fd is None else Claim(response_id, fd, path)

    async def release(self, claim: Claim, keep_marker: bool = False) -> None:
        if claim.path is not None and not keep_marker:
            with contextlib.suppress(OSError):
                claim.path.unlink()
        if claim.fd is not None:
            with contextlib.suppress(OSError):
                os.close(claim.fd)
            claim.fd = None

    def _orphans(self) -> list[Claim]:
        found: list[Claim] = []
        now = time.time()
        if not self.markers.is_dir():
            return found
        for path in self.markers.iterdir():
            try:
                if now - path.stat().st_mtime < self.ORPHAN_AGE:
                    continue
            except OSError:
                continue
            fd = self._lock(path, False)
            if fd is not None:
                found.append(Claim(path.name, fd, path))
        return found

    async def orphans(self) -> list[Claim]:
        return await run_in_threadpool(self._orphans)

    def _path(self, response_id: str) -> Path | None:
        """The file of ``response_id``; None for an id that could not be ours (no path
        tricks: ``..``, slashes and dot files never reach the filesystem)."""
        if not _SAFE_ID.fullmatch(response_id):
            return None
        return self.dir / (response_id + self.SUFFIX)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- async interface (file work on a worker thread) ----------------------------------
    async def put(self, response: dict[str, Any], conversation: list[dict[str, Any]],
                  items: list[dict[str, Any]] | None = None,
                  request: dict[str, Any] | None = None) -> None:
        await run_in_threadpool(self.put_sync, response, conversation, items, request)

    async def get(self, response_id: str) -> StoredResponse | None:
        return await run_in_threadpool(self.get_sync, response_id)

    async def delete(self, response_id: str) -> bool:
        return await run_in_threadpool(self.delete_sync, response_id)

    # -- file work ------------------------------------------------------------------------
    def put_sync(self, response: dict[str, Any], conversation: list[dict[str, Any]],
                 items: list[dict[str, Any]] | None = None,
                 request: dict[str, Any] | None = None) -> None:
        path = self._path(response["id"])
        if path is None or self.max_items <= 0:
            return
        data = json.dumps({"response": response, "conversation": conversation,  # ASCII: any
                           "items": items or [], "request": request,  # text, lone
                           "stored_at": time.time()}).encode()  # surrogates too
        if len(data) > self.max_bytes:
            return
        tmp = self.dir / f".tmp-{path.name}-{os.getpid()}-{threading.get_ident()}"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        self.trim()

    def get_sync(self, response_id: str) -> StoredResponse | None:
        path = self._path(response_id)
        if path is None:
            return None
        try:
            data = path.read_bytes()
            record = json.loads(data)
            item = StoredResponse(record["response"], record["conversation"], len(data),
                                  float(record["stored_at"]), record.get("items") or [],
                                  record.get("request"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):  # damaged: never served
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return None
        if self.ttl > 0 and time.time() - item.stored_at > self.ttl:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return None
        return item

    def delete_sync(self, response_id: str) -> bool:
        path = self._path(response_id)
        if path is None:
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def trim(self) -> None:
        """Delete expired responses, then the oldest, until every bound holds across all
        processes sharing the directory; temporary files of writers that died go too."""
        with self._locked():
            files: list[tuple[float, int, Path]] = []
            now = time.time()
            with os.scandir(self.dir) as it:
                for entry in it:
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    if entry.name.startswith(".tmp-") and now - st.st_mtime > 600:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
                    elif entry.name.endswith(self.SUFFIX) and not entry.name.startswith("."):
                        files.append((st.st_mtime, st.st_size, Path(entry.path)))
            files.sort()
            count, total = len(files), sum(size for _, size, _ in files)
            for mtime, size, path in files:  # oldest first
                expired = self.ttl > 0 and now - mtime > self.ttl
                if not expired and count <= self.max_items and total <= self.max_bytes:
                    break
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
                count, total = count - 1, total - size

    def __len__(self) -> int:
        return sum(1 for p in self.dir.iterdir()
                   if p.name.endswith(self.SUFFIX) and not p.name.startswith("."))


def open_response_store(path: str | None, max_items: int, max_bytes: int,
                        ttl: float) -> ResponseStore:
    if path:
        return DirectoryResponseStore(path, max_items, max_bytes, ttl)
    return MemoryResponseStore(max_items, max_bytes, ttl)
