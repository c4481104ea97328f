"""The Batch API's worker: one asyncio task that takes the active batches oldest first,
validates their input, runs their lines through the interactive route handlers (the same
validation, code paths and error bodies) at the engine's background priority, commits
each line's result as it finishes, and writes the output and error files.

Concurrency: the model's sequences (``server.batch_max_inflight``) while no interactive
request runs; no new line while they do; the scheduler admits waiting interactive
requests before batch lines (``engine.request.Request.priority``), and a running line
gives its sequence up to one that finds none free (``Request.suspend``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.requests import Request
from starlette.responses import Response

from api.batch.store import BatchStore, FileRow, Line
from api.batch.validate import check_file
from api.openai.chat import create_chat_completion
from api.openai.completions import create_completion
from api.openai.embeddings import create_embedding
from api.responses.routes import create_response
from api.web.engine_client import PRIORITY
from api.web.errors import APIError
from api.web.state import ServerState
from engine.config import ServerConfig
from engine.request import BACKGROUND

log = logging.getLogger("llamaserve.batch")
T = TypeVar("T")

HANDLERS: dict[str, Callable[[Request], Awaitable[Response]]] = {
    "/v1/chat/completions": create_chat_completion,
    "/v1/completions": create_completion,
    "/v1/embeddings": create_embedding,
    "/v1/responses": create_response,
}
FINAL = {"cancelling": "cancelled", "finalizing": "completed"}
SWEEP_SECONDS = 600.0
EMBED_INFLIGHT = 4  # embedding lines in flight (they hold no sequence)
TRANSIENT = (429, 503)  # a line answered so is not recorded: it runs again later
RETRY_SECONDS = 1.0
BUSY_HOLD = 1.0  # seconds after an interactive request before batch lines start again


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        kw: dict[str, Any] = {"registry": registry}
        self.queued = Gauge("llamaserve_batch_lines_queued",
                            "Batch lines waiting to run (in_progress batches).", **kw)
        self.running = Gauge("llamaserve_batch_lines_running", "Batch lines running.", **kw)
        self.done = Counter("llamaserve_batch_lines_done",
                            "Batch lines answered with a 2xx response.", **kw)
        self.failed = Counter("llamaserve_batch_lines_failed",
                              "Batch lines answered with an error.", **kw)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class BatchService:
    def __init__(self, server: ServerState, app: Any, cfg: ServerConfig,
                 registry: CollectorRegistry | None) -> None:
        assert cfg.batch_dir is not None
        self.server, self.app, self.cfg = server, app, cfg
        self.store = BatchStore(cfg.batch_dir)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="llamaserve-batch-io")
        self.metrics = BatchMetrics(registry)
        self.wake = asyncio.Event()
        self.inflight = 0
        self._busy_at = -BUSY_HOLD  # when an interactive request was last seen running
        self.cancelled: set[str] = set()
        self._task: asyncio.Future[None] | None = None

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """Store calls, one at a time on the store's own thread."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def notify(self) -> None:
        self.wake.set()

    # -- the loop --------------------------------------------------------------
    async def _run(self) -> None:
        swept = 0.0
        while True:
            try:
                if time.monotonic() - swept > SWEEP_SECONDS:
                    swept = time.monotonic()
                    if self.cfg.batch_retention:
                        await self.io(self.store.expire, self.cfg.batch_retention)
                self.wake.clear()
                active = await self.io(self.store.active_batches)
                for batch in active:
                    await self._advance(batch)
                if not active:
                    await asyncio.wait_for(self.wake.wait(), SWEEP_SECONDS)
            except asyncio.TimeoutError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch worker step failed")
                await asyncio.sleep(1.0)

    async def _advance(self, batch: dict[str, Any]) -> None:
        status = batch["status"]
        if status == "validating":
            await self._validate(batch)
        elif status == "in_progress":
            await self._run_lines(batch)
        else:  # cancelling / finalizing: results so far become the files
            await self._finalize(batch, batch.pop("_final", None) or FINAL[status])

    async def _validate(self, batch: dict[str, Any]) -> None:
        def check() -> tuple[list[Line], list[dict[str, Any]]]:
            with open(self.store.path(batch["input_file_id"]), "rb") as f:
                c = check_file(f, batch["endpoint"], self.cfg.batch_max_lines)
            return c.lines, c.errors

        try:
            lines, errors = await self.io(check)
        except OSError:
            lines, errors = [], [{"code": "file_not_found", "line": None, "param": None,
                                  "message": "The input file is gone."}]
        now = int(time.time())
        if errors:
            batch.update(status="failed", failed_at=now,
                         errors={"object": "list", "data": errors})
            await self.io(self.store.update_batch, batch)
            return
        batch.update(status="in_progress", in_progress_at=now,
                     request_counts={"total": len(lines), "completed": 0, "failed": 0})
        await self.io(self.store.start_batch, batch, lines)

    async def _run_lines(self, batch: dict[str, Any]) -> None:
        bid = batch["id"]
        running: set[asyncio.Task[None]] = set()
        last = -1
        stop: str | None = None
        try:
            while stop is None:
                pending = await self.io(self.store.pending, bid, last, 256)
                if not pending:
                    if running:
                        await asyncio.wait(running)
                        running = set()
                    n, ok, bad = await self.io(self.store.counts, bid)
                    if ok + bad >= n:
                        break
                    # lines answered 503 / 429 (engine down, queue full) were not recorded:
                    # another pass over what is left, after a pause
                    await asyncio.sleep(RETRY_SECONDS)
                    last, stop = -1, self._stop_reason(batch)
                    continue
                total = (await self.io(self.store.counts, bid))
                self.metrics.queued.set(total[0] - total[1] - total[2])
                for line in pending:
                    while len(running) >= self._slots(batch["endpoint"]):
                        if running:
                            await asyncio.wait(running, timeout=0.05,
                                               return_when=asyncio.FIRST_COMPLETED)
                        else:  # paused while interactive requests run
                            await asyncio.sleep(0.05)
                        running = {t for t in running if not t.done()}
                        if self._stop_reason(batch) is not None:
                            break
                    stop = self._stop_reason(batch)
                    if stop is not None:
                        break
                    running.add(asyncio.ensure_future(self._line(batch, line)))
                    last = line.idx
            if running:
                if stop is None:
                    await asyncio.wait(running)
                else:
                    for t in running:
                        t.cancel()
                    await asyncio.wait(running)
        except asyncio.CancelledError:
            for t in running:
                t.cancel()
            raise
        finally:
            self.metrics.queued.set(0)
        stop = stop or self._stop_reason(batch)
        now = int(time.time())
        if stop == "expired":
            batch.update(status="finalizing", finalizing_at=now, _final="expired")
        elif stop == "cancelled":
            fresh = await self.io(self.store.batch, bid) or batch
            batch.update(status="cancelling", cancelling_at=fresh.get("cancelling_at") or now)
        else:
            batch.update(status="finalizing", finalizing_at=now)
        await self.io(self.store.update_batch, batch)
        await self._finalize(batch, batch.pop("_final", None) or FINAL[batch["status"]])

    def _stop_reason(self, batch: dict[str, Any]) -> str | None:
        if batch["id"] in self.cancelled:
            return "cancelled"
        if batch.get("expires_at") and time.time() > batch["expires_at"]:
            return "expired"
        return None

    def _slots(self, endpoint: str) -> int:
        """Lines in flight. Generation: with no interactive request running or seen in the
        last ``BUSY_HOLD`` seconds, the model's sequences (``server.batch_max_inflight``);
        while interactive requests run, none start, so interactive steps stay as short as
        without the batch. Waiting interactive requests are admitted before batch lines
        (``Request.priority``), and take a running line's sequence when none is free
        (the engine suspends the line; it carries on later where it was).
        Embedding lines hold no sequence: a few at a time, packed with other requests'
        inputs."""
        if endpoint == "/v1/embeddings":
            return self.cfg.batch_max_inflight or EMBED_INFLIGHT
        try:
            state = self.server.default
        except APIError:
            return 1
        now = time.monotonic()
        if state.client.outstanding > state.client.background:  # interactive ones run
            self._busy_at = now
        if now - self._busy_at < BUSY_HOLD:
            return 0
        return self.cfg.batch_max_inflight or state.model.n_seq_max

    async def _line(self, batch: dict[str, Any], line: Line) -> None:
        self.inflight += 1
        self.metrics.running.inc()
        try:
            raw = await self.io(self.store.read_line, batch["input_file_id"], line.offset,
                                line.length)
            body = json.dumps(json.loads(raw)["body"]).encode()
            status, answer = await self.dispatch(batch["endpoint"], body)
            if status in TRANSIENT:  # the server's state, not the line's: run it later
                log.warning("batch %s line %d: %d, retried later", batch["id"], line.idx,
                            status)
                return
            rid = new_id("req")
            result = json.dumps({
                "id": new_id("batch_req"), "custom_id": line.custom_id,
                "response": {"status_code": status, "request_id": rid, "body": answer},
                "error": None})
            await self.io(self.store.finish_line, batch["id"], line.idx, status, result)
            (self.metrics.done if status < 300 else self.metrics.failed).inc()
        finally:
            self.inflight -= 1
            self.metrics.running.dec()

    async def dispatch(self, path: str, body: bytes) -> tuple[int, Any]:
        """One request through its route handler, as the interactive route runs it."""
        handler = HANDLERS[path]
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "client": ("batch", 0), "server": None,
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "app": self.app, "state": {}, "llamaserve": {}}
        sent = False
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()  # a batch line has no client to leave
            return {"type": "http.disconnect"}

        token = PRIORITY.set(BACKGROUND)
        try:
            response = await handler(Request(scope, receive))
            return response.status_code, json.loads(bytes(response.body))
        except APIError as exc:
            return exc.status, exc.body(path)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("batch line failed on %s", path)
            return 500, APIError(f"Internal server error: {type(exc).__name__}", status=500,
                                 code="internal_error").body(path)
        finally:
            PRIORITY.reset(token)
            for release in scope["llamaserve"].pop("leases", []):
                release()

    async def _finalize(self, batch: dict[str, Any], final: str) -> None:
        bid, now = batch["id"], int(time.time())
        total, completed, failed = await self.io(self.store.counts, bid)
        owner = await self.io(self.store.batch_owner, bid)
        outputs: list[FileRow] = []
        usage = {"input_tokens": 0, "output_tokens": 0}

        def write(ok: bool) -> FileRow | None:
            fid = new_id("file")
            size = count = 0
            with open(self.store.temp_path(fid), "wb") as f:
                for result in self.store.results(bid, ok):
                    if ok:
                        u = (json.loads(result)["response"]["body"] or {}).get("usage") or {}
                        usage["input_tokens"] += int(u.get("prompt_tokens",
                                                           u.get("input_tokens", 0)) or 0)
                        usage["output_tokens"] += int(u.get("completion_tokens",
                                                            u.get("output_tokens", 0)) or 0)
                    data = result.encode() + b"\n"
                    f.write(data)
                    size += len(data)
                    count += 1
            if not count:
                self.store.temp_path(fid).unlink()
                return None
            name = f"batch_{bid}_{'output' if ok else 'error'}.jsonl"
            return FileRow(fid, "batch_output", name, size, count, now, owner)

        for ok in (True, False):
            row = await self.io(write, ok)
            if row is not None:
                outputs.append(row)
                batch["output_file_id" if ok else "error_file_id"] = row.id
        batch.update(status=final, request_counts={"total": total, "completed": completed,
                                                   "failed": failed},
                     usage={**usage, "total_tokens": sum(usage.values()),
                            "input_tokens_details": {"cached_tokens": 0},
                            "output_tokens_details": {"reasoning_tokens": 0}})
        batch[{"completed": "completed_at", "cancelled": "cancelled_at",
               "expired": "expired_at"}[final]] = now
        await self.io(self.store.finalize, batch, outputs)
        self.cancelled.discard(bid)
        log.info("batch %s %s: %d completed, %d failed of %d", bid, final, completed, failed,
                 total)

    # -- what the routes ask ---------------------------------------------------
    async def live(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with its current request counts while it runs."""
        if batch["status"] in ("in_progress", "cancelling", "finalizing"):
            total, completed, failed = await self.io(self.store.counts, batch["id"])
            if total:
                batch["request_counts"] = {"total": total, "completed": completed,
                                           "failed": failed}
        batch.pop("_final", None)
        return batch
