"""Background responses (``background: true``): generated after the request returns.

``POST /v1/responses`` with ``background`` answers at once with the response ``queued``
(streamed, it sends the events as they come and the run goes on if the client leaves).
The run stores the response when it starts and when it ends; ``GET /v1/responses/{id}``
polls it and ``POST /v1/responses/{id}/cancel`` stops it (the engine frees its sequence
at its next step) and stores it ``cancelled``.

They survive the server's death where the store is a directory
(``server.responses_store_path``): a running response holds an exclusive lock on a marker file
(``<store>/.background/<id>``) and keeps its request in the store. The kernel drops the
lock when the process dies, ``kill -9`` included; any server sharing the store (the same
one restarted, or a replica) finds the unlocked marker at start-up or within
``SCAN_SECONDS``, takes the lock and runs the response again from its request, under the
same id. A response is generated whole again, not continued from where it stopped.
A drain (SIGTERM) hands them over the same way at once: they stop, stay stored
``in_progress`` with their markers, and the next server resumes them. On the in-memory
store they run on within the drain's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from api.responses.store import Claim, ResponseStore
from api.web.errors import APIError

log = logging.getLogger("llamaserve.api")
SCAN_SECONDS = 10.0
ACTIVE = ("queued", "in_progress")


@dataclass
class BackgroundRun:
    run: Any  # api.responses.routes.ResponseRun
    claim: Claim | None
    task: asyncio.Task[None] | None = None
    listeners: list[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=list)
    cancelled: bool = False  # by the client: stored ``cancelled`` however the run ends

    def cancel(self) -> None:
        self.cancelled = True
        if self.run.gen is not None:
            self.run.gen.cancel()  # the engine lets the sequence go at its next step
        if self.task is not None:
            self.task.cancel()


class BackgroundRuns:
    """This process's background responses, and the scan that resumes orphaned ones."""

    def __init__(self, store: ResponseStore, resume: Any) -> None:
        self.store = store
        self.resume = resume  # async (stored request, response id, claim) -> None
        self.runs: dict[str, BackgroundRun] = {}
        self._scan: asyncio.Task[None] | None = None
        self.stopping = False  # the server is shutting down: runs are left to resume

    def start(self) -> None:
        if self.store.can_claim:
            self._scan = asyncio.get_running_loop().create_task(self._scan_loop())

    def stop(self) -> None:
        """Shutting down: stop generating, but leave each run as stored (``in_progress``)
        with its marker in place, so the next server on a directory store resumes it, as
        after ``kill -9``; nothing is stored ``cancelled``."""
        self.stopping = True
        if self._scan is not None:
            self._scan.cancel()
        for item in list(self.runs.values()):
            if item.task is not None:
                item.task.cancel()

    async def begin(self, run: Any, request: dict[str, Any], claim: Claim | None = None,
                    listeners: list[asyncio.Queue[dict[str, Any] | None]] | None = None
                    ) -> BackgroundRun:
        """Start the run, store it, and go on on a task of its own (``claim``: the marker
        of a resumed run, already held). A request the run refuses (a bad tool, a prompt
        too long) raises here, before anything is stored: the client gets its 4xx."""
        response_id = run.builder.response_id
        run.builder.status = "queued"
        events = run.events()
        first = await anext(events)
        if claim is None:
            claim = await self.store.claim(response_id)
        run.request = request
        run.builder.status = "in_progress"
        item = BackgroundRun(run, claim, listeners=listeners or [])
        self.runs[response_id] = item
        for queue in item.listeners:
            queue.put_nowait(first)
        try:
            await run.save(final=False)
        except BaseException:  # the store failed: nothing runs unrecorded
            await events.aclose()
            self.runs.pop(response_id, None)
            if claim is not None:
                await self.store.release(claim)
            raise
        item.task = asyncio.get_running_loop().create_task(self._drive(item, events))
        return item

    async def _drive(self, item: BackgroundRun, events: Any) -> None:
        run = item.run
        try:
            async for event in events:
                for queue in item.listeners:
                    queue.put_nowait(event)
        except asyncio.CancelledError:
            pass  # a client's cancel, or the server stopping: _finish tells which
        except APIError as exc:
            for event in run.builder.fail(exc.message, exc.code or "server_error"):
                for queue in item.listeners:
                    queue.put_nowait(event)
        except Exception as exc:  # never lose the record: store it failed
            log.exception("background response %s failed", run.builder.response_id)
            run.builder.fail(f"Internal server error: {type(exc).__name__}")
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()
            if run.gen is not None:
                run.gen.cancel()
            await asyncio.shield(self._finish(item))

    async def _finish(self, item: BackgroundRun) -> None:
        run = item.run
        if item.cancelled:
            run.builder.status = "cancelled"
        left = self.stopping and not item.cancelled  # stored as running: resumed later
        try:
            if not left:
                await run.save()
        finally:
            self.runs.pop(run.builder.response_id, None)
            if item.claim is not None:
                await self.store.release(item.claim, keep_marker=left)
            for queue in item.listeners:
                queue.put_nowait(None)

    async def cancel(self, response_id: str) -> dict[str, Any] | None:
        """Stop a run of this process; its stored response once it has stopped. None
        where no run of this process has that id."""
        item = self.runs.get(response_id)
        if item is None:
            return None
        item.cancel()
        if item.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(item.task)
        response: dict[str, Any] = item.run.builder.response()
        return response

    async def _scan_loop(self) -> None:
        while True:
            try:
                for claim in await self.store.orphans():
                    stored = await self.store.get(claim.response_id)
                    if stored is None or stored.request is None \
                            or stored.response.get("status") not in ACTIVE:
                        await self.store.release(claim)
                        continue
                    log.info("resuming background response %s (its server stopped)",
                             claim.response_id)
                    try:
                        await self.resume(stored, claim)
                    except Exception:
                        log.exception("cannot resume background response %s",
                                      claim.response_id)
                        await self.store.release(claim)
            except Exception:
                log.exception("background response scan failed")
            await asyncio.sleep(SCAN_SECONDS)
