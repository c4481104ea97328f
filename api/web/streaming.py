"""Server-sent events, per-choice accumulation, and cancellation when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.web.engine_client import ClientTooSlow, Generation
from api.web.errors import APIError
from api.web.gate import note_usage
from engine.request import BackendUnavailable, Delta, RequestTimeout, TokenLogprob

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


_SLOT = "\x00slot\x00"
_encode_str: Callable[[str], str] = json.encoder.encode_basestring  # json.dumps' own, in C


class TextEvent:
    """An SSE event that differs from token to token only in one string (a streamed
    token's text), encoded once: ``event(text)`` is byte for byte ``sse(payload)`` with
    the text in the place of ``SLOT`` in ``payload``, at the cost of encoding the text
    alone (the whole payload's ``json.dumps`` was ~10 µs of the event loop per token)."""

    SLOT = _SLOT

    def __init__(self, payload: dict[str, Any]) -> None:
        head, slot, tail = sse(payload).partition(_encode_str(_SLOT).encode())
        assert slot, "the payload has no SLOT"
        self.head, self.tail = head, tail

    def __call__(self, text: str) -> bytes:
        return self.head + _encode_str(text).encode() + self.tail


class ClientLeft(Exception):
    """The client disconnected before its response was complete."""


async def unless_client_leaves(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work`` in the current task while one plain task listens for the client
    leaving; when it leaves, ``work`` is cancelled and ``ClientLeft`` raised. (Starlette's
    StreamingResponse does this with an anyio task group and cancel scope, ~0.1 ms of the
    event loop per response, and its stream starts a turn of the loop later.)"""
    task = asyncio.current_task()
    assert task is not None
    left = False

    async def listen() -> None:
        nonlocal left
        while (await receive())["type"] != "http.disconnect":
            pass
        left = True
        task.cancel()

    listener = asyncio.get_running_loop().create_task(listen())
    try:
        return await work
    except asyncio.CancelledError:
        if not left:  # cancelled from elsewhere (the server stopping)
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+: this one is handled
        if uncancel is not None:
            uncancel()
        raise ClientLeft from None
    finally:
        listener.cancel()


KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it, proxies see traffic


class BeatingResponse(StreamingResponse):
    """Starlette's StreamingResponse with keep-alive beats from a timer: whenever no chunk
    went out for ``keepalive`` seconds (a long prefill, text held back), the timer sends
    ``beat`` (an SSE comment, an Anthropic ping, an NDJSON line) between two chunks, so
    idle timeouts of clients and proxies never fire on a stream that is alive. A chunk
    costs one clock read: no task, future or hand-off per streamed token (a pump task
    reading the source took ~60 µs of the event loop per token that way). 0 turns the
    beats off."""

    def __init__(self, content: AsyncIterator[bytes], keepalive: float = 0,
                 beat: bytes = KEEPALIVE, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.keepalive, self.beat = keepalive, beat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        # a client that left: stream_response closed the source (its generation cancelled)
        with contextlib.suppress(ClientLeft):
            await unless_client_leaves(receive, self.stream_response(send))
        if self.background is not None:
            await self.background()

    async def stream_response(self, send: Any) -> None:
        """As Starlette's, plus the beats, and the source closed when the stream ends for
        any reason (the client left: its generation is cancelled at once, not when the
        garbage collector gets to the generator)."""
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        loop = asyncio.get_running_loop()
        seconds, last = self.keepalive, loop.time()
        beating: asyncio.Task[None] | None = None
        timer: asyncio.TimerHandle | None = None

        def tick() -> None:
            nonlocal timer, beating
            due = last + seconds
            if loop.time() >= due:
                if beating is None or beating.done():
                    beating = loop.create_task(send({"type": "http.response.body",
                                                     "body": self.beat, "more_body": True}))
                due = loop.time() + seconds
            timer = loop.call_at(due, tick)

        if seconds > 0:
            timer = loop.call_at(last + seconds, tick)
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                last = loop.time()
        finally:
            if timer is not None:
                timer.cancel()
            if beating is not None and not beating.done():
                beating.cancel()
                await asyncio.gather(beating, return_exceptions=True)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse_response(gen: Generation, chunks: AsyncIterator[bytes], keepalive: float = 0,
                 beat: bytes = KEEPALIVE, headers: dict[str, str] | None = None
                 ) -> BeatingResponse:
    """Stream SSE chunks with keep-alive beats; when the client disconnects Starlette
    cancels the iterator and the generation is cancelled, freeing its sequences at the
    next engine step."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            gen.cancel()

    return BeatingResponse(body(), keepalive, beat, media_type="text/event-stream",
                           headers=headers or {"Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})


def error_event(error: APIError) -> bytes:
    return sse(error.body())


async def unless_disconnected(request: Request, gen: Generation, work: Awaitable[T]) -> T:
    """Await ``work`` (a non-streamed response); cancel the generation if the client leaves."""

    try:
        return await unless_client_leaves(request.receive, work)
    except ClientLeft:
        gen.cancel()
        raise APIError("client disconnected", status=499, code="client_disconnected") \
            from None


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
