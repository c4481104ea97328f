"""Server-sent events, per-choice accumulation, and cancellation when the client goes away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from api.web.engine_client import ClientTooSlow, Generation
from api.web.errors import APIError
from api.web.gate import note_usage
from engine.request import BackendUnavailable, Delta, RequestTimeout, TokenLogprob

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it, proxies see traffic


async def with_keepalive(chunks: AsyncIterator[bytes], seconds: float,
                         beat: bytes = KEEPALIVE) -> AsyncIterator[bytes]:
    """``chunks``, with a keep-alive comment whenever none came for ``seconds`` (a long
    prefill, or text held back): idle timeouts of clients and proxies never fire on a
    stream that is alive. 0 turns it off.

    One pump task reads the source, at most one chunk ahead of the client (a slow client
    still backs up its request's queue), and a timer re-armed from the last chunk sends
    the beats: no task or timeout per chunk (a task and ``asyncio.wait`` per chunk cost
    ~20 µs of the event loop's time for every streamed token)."""
    if seconds <= 0:
        async for chunk in chunks:
            yield chunk
        return
    loop = asyncio.get_running_loop()
    it = aiter(chunks)
    end = object()
    box: list[Any] = []  # a chunk, then maybe an exception or the end, for the consumer
    waiter: asyncio.Future[None] | None = None  # the consumer's, while it waits
    taken: asyncio.Future[None] | None = None  # the pump's, while the box is full
    last = loop.time()

    def wake() -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def pump() -> None:
        nonlocal taken
        try:
            async for chunk in it:
                box.append(chunk)
                wake()
                taken = loop.create_future()
                await taken
        except Exception as exc:  # raised in the consumer
            box.append(exc)
        box.append(end)
        wake()

    timer: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal timer
        due = last + seconds
        if loop.time() >= due and waiter is not None:
            wake()
            due = loop.time() + seconds
        timer = loop.call_at(due, tick)

    task = loop.create_task(pump())
    timer = loop.call_at(last + seconds, tick)
    try:
        while True:
            if not box:
                waiter = loop.create_future()
                await waiter
                waiter = None
                if not box:  # the timer: silent for `seconds`
                    last = loop.time()
                    yield beat
                    continue
            item = box.pop(0)
            if item is end:
                return
            if isinstance(item, Exception):
                raise item
            if taken is not None and not taken.done():
                taken.set_result(None)
            last = loop.time()
            yield item
    finally:
        if timer is not None:
            timer.cancel()
        task.cancel()  # the client left while we waited: stop the source too


def sse_response(gen: Generation, chunks: AsyncIterator[bytes], keepalive: float = 0
                 ) -> StreamingResponse:
    """Stream chunks; when the client disconnects Starlette cancels the iterator and
    the generation is cancelled, freeing its sequences at the next engine step."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in with_keepalive(chunks, keepalive):
                yield chunk
        finally:
            gen.cancel()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def error_event(error: APIError) -> bytes:
    return sse(error.body())


async def unless_disconnected(request: Request, gen: Generation, work: Awaitable[T]) -> T:
    """Await ``work`` (a non-streamed response); cancel the generation if the client leaves."""

    async def wait_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        gen.cancel()
        raise APIError("client disconnected", status=499, code="client_disconnected")
    return task.result()


@dataclass
class ChoiceResult:
    index: int
    parts: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    timed_out: bool = False
    stop_sequence: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, d: Delta) -> None:
        if isinstance(d.error, RequestTimeout):
            raise APIError(f"Request timed out: {d.error}", status=408, code="request_timeout")
        if isinstance(d.error, ClientTooSlow):
            raise APIError(f"Request cancelled: {d.error}", status=408, code="client_too_slow")
        if isinstance(d.error, BackendUnavailable):
            raise APIError(f"Generation failed: {d.error}", status=503,
                           code="backend_unavailable")
        if d.error is not None:
            raise APIError(f"Generation failed: {d.error}", status=500, code="engine_error")
        self.timed_out = self.timed_out or d.timed_out
        self.stop_sequence = d.stop_sequence or self.stop_sequence
        self.parts.append(d.text)
        self.tokens.extend(d.token_ids)
        if d.logprobs:
            self.logprobs.extend(d.logprobs)
        if d.prompt_logprobs is not None:
            self.prompt_logprobs = d.prompt_logprobs
        self.finish_reason = d.finish_reason or self.finish_reason
        self.prompt_tokens = d.prompt_tokens or self.prompt_tokens
        self.completion_tokens = d.completion_tokens
        self.cached_tokens = max(self.cached_tokens, d.cached_tokens)


async def collect(gen: Generation) -> list[ChoiceResult]:
    results = {r.index: ChoiceResult(r.index) for r in gen.requests}
    async for delta in gen.deltas():
        results[delta.index].add(delta)
    return [results[i] for i in sorted(results)]


def usage(results: list[ChoiceResult], n: int) -> dict[str, Any]:
    """Prompt tokens count once per prompt (not per choice), as OpenAI does."""
    prompt = sum(r.prompt_tokens for r in results if r.index % n == 0)
    cached = sum(r.cached_tokens for r in results if r.index % n == 0)
    completion = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def final_usage(scope: Any, model: str, results: list[ChoiceResult], n: int) -> dict[str, Any]:
    """The usage object, also recorded for the access log."""
    u = usage(results, n)
    note_usage(scope, model, u["prompt_tokens"], u["completion_tokens"])
    return u


def timeout_flag(results: list[ChoiceResult]) -> dict[str, Any]:
    """``{"timed_out": true}`` when server.request_timeout cut a choice short."""
    return {"timed_out": True} if any(r.timed_out for r in results) else {}
