"""The bridge between the asyncio world and the engine thread.

Results arrive once per engine step through ``loop.call_soon_threadsafe`` and
are dispatched to one ``asyncio.Queue`` per HTTP request; no thread is held per
request and no executor hop happens per token. Blocking preparation work
(template rendering, tokenization) runs once per request on a small pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from api.web.errors import APIError
from api.web.params import choice_seed
from engine.handle import ContextLengthExceeded, EmbedJob, ModelHandle
from engine.media.spans import MediaSpan
from engine.request import (
    BackendUnavailable,
    Delta,
    EngineError,
    Request,
    SamplingParams,
    Status,
)

T = TypeVar("T")

# a few texts this short in all are tokenized on the event loop itself: tokenizing 512
# characters takes ~0.2 ms, about what a hop to the prepare pool and back costs (0.3 ms at
# one stream, measured on the tiny model), and a streamed request's first token waits for
# both; many texts (each a call into llama.cpp) go to the pool however short
INLINE_CHARS = 512
INLINE_TEXTS = 8

# engine.request.Request.priority of the requests started in this context (the batch
# worker sets it to engine.request.BACKGROUND around a batch line)
PRIORITY: contextvars.ContextVar[int] = contextvars.ContextVar("llamaserve_priority",
                                                               default=0)


class ClientTooSlow(EngineError):
    """The client stopped reading and its buffered output reached the limit."""


def unavailable(exc: EngineError) -> APIError:
    """The 503 for a request the engine refused: it is down, or a backend of the model
    (an RPC server) is."""
    code = "backend_unavailable" if isinstance(exc, BackendUnavailable) else \
        "engine_unavailable"
    return APIError(str(exc), status=503, code=code)


class Generation:
    """The sequences of one HTTP request (prompts x n choices) running on the engine."""

    def __init__(self, model: ModelHandle, requests: list[Request],
                 queue: asyncio.Queue[Delta]) -> None:
        self.model = model
        self.requests = requests
        self.queue = queue

    async def deltas(self) -> AsyncIterator[Delta]:
        remaining = len(self.requests)
        while remaining:
            delta = await self.queue.get()
            if delta.finish_reason is not None:
                remaining -= 1
            yield delta

    def cancel(self) -> None:
        for r in self.requests:
            if r.status is not Status.FINISHED:
                self.model.cancel(r)


class EngineClient:
    """One model's asyncio side: submits its requests through the model's handle and
    delivers what the engine thread publishes."""

    def __init__(self, model: ModelHandle, workers: int = 4, max_queue: int = 1 << 30,
                 request_timeout: float = 0.0, max_buffered: int = 1024,
                 clamp_max_tokens: bool = True) -> None:
        self.model = model
        self.clamp_max_tokens = clamp_max_tokens  # server.clamp_max_tokens
        # engine steps of output a request may have waiting for its client; past it the
        # client is too slow and the request is cancelled (its queue holds no more)
        self.max_buffered = max_buffered
        self.too_slow: set[Request] = set()
        self.max_outstanding = model.n_seq_max + max_queue
        self.request_timeout = request_timeout
        self.outstanding = 0  # sequences submitted and not finished (event-loop thread)
        self.background = 0  # of those, batch lines' (priority > 0)
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="llamaserve-prepare")
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.model.start(self._publish)

    def stop(self) -> None:
        self.model.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _publish(self, batch: list[tuple[Request, Delta]]) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._dispatch, batch)

    def _dispatch(self, batch: list[tuple[Request, Delta]]) -> None:
        for request, delta in batch:
            if delta.finish_reason is not None:
                self.outstanding -= 1
                if request.priority:
                    self.background -= 1
            queue = request.consumer
            if request in self.too_slow:  # cancelled: only its end is still delivered
                if delta.finish_reason is not None:
                    self.too_slow.discard(request)
                    queue.put_nowait(Delta(
                        index=delta.index, finish_reason="error",
                        prompt_tokens=delta.prompt_tokens,
                        completion_tokens=delta.completion_tokens,
                        error=ClientTooSlow(f"the client did not read its output: "
                                            f"{self.max_buffered} steps were waiting")))
                continue
            if delta.finish_reason is None and queue.qsize() >= self.max_buffered:
                self.too_slow.add(request)
                self.model.note_slow_client()
                self.model.cancel(request)
                continue
            queue.put_nowait(delta)

    def cancel_all(self) -> None:
        """Cancel every request the engine holds (the end of a drain)."""
        self.model.cancel_all()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the prepare pool (blocking work: templates, grammars, long
        text; llama.cpp's tokenizer releases the GIL, so the event loop keeps serving)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, fn, *args)

    async def tokenize(self, fn: Callable[..., T], *args: Any, texts: Sequence[Sized]) -> T:
        """``fn(*args)``, which tokenizes (or detokenizes) ``texts``: on the event loop
        when they are at most ``INLINE_TEXTS`` of ``INLINE_CHARS`` characters (or tokens)
        in all, else on the pool."""
        if len(texts) <= INLINE_TEXTS and sum(map(len, texts)) <= INLINE_CHARS:
            return fn(*args)
        return await self.run(fn, *args)

    def generate(self, prompts: Sequence[list[int]], params: SamplingParams, n: int,
                 param: str = "prompt", media: tuple[MediaSpan, ...] = (),
                 adapters: tuple[tuple[str, float], ...] = (),
                 clamp: bool | None = None, whole: bool = False,
                 message_ends: tuple[int, ...] = ()) -> Generation:
        """Admission-check and submit every (prompt, choice); all or nothing. ``clamp``:
        a ``max_tokens`` beyond the context's room is cut to it (None: as
        ``server.clamp_max_tokens`` says; the Anthropic API always).
        ``whole``: the caller reads only the finished result (a response that is not
        streamed), so each sequence's output arrives once, at its end, instead of waking
        the event loop at every engine step. ``message_ends``: positions in the prompt
        where a message's text ends inside a turn (``Prepared.message_ends``)."""
        count = len(prompts) * n
        if clamp is None:
            clamp = self.clamp_max_tokens
        if self.outstanding + count > self.max_outstanding:
            raise APIError("The server is at capacity (its queue is full); retry shortly.",
                           status=429, code="queue_full", headers={"Retry-After": "1"})
        deadline = time.monotonic() + self.request_timeout if self.request_timeout else None
        queue: asyncio.Queue[Delta] = asyncio.Queue()
        requests = []
        for p_index, prompt in enumerate(prompts):
            if not prompt:
                raise APIError("The prompt is empty after tokenization", param=param,
                               code="invalid_value")
            for i in range(n):
                try:
                    max_new = self.model.max_new_tokens(len(prompt), params.max_tokens,
                                                          clamp=clamp)
                except ContextLengthExceeded as exc:
                    raise APIError(str(exc), param=param, code="context_length_exceeded") \
                        from None
                choice = dataclasses.replace(params, seed=choice_seed(params.seed, i))
                requests.append(Request(prompt=prompt, params=choice, max_new_tokens=max_new,
                                        consumer=queue, index=p_index * n + i,
                                        deadline=deadline, adapters=adapters,
                                        media=tuple(s.fresh() for s in media),
                                        priority=PRIORITY.get(), whole=whole,
                                        message_ends=message_ends))
        background = len(requests) if PRIORITY.get() else 0
        self.outstanding += len(requests)
        self.background += background
        try:
            for r in requests:
                self.model.submit(r)
        except EngineError as exc:
            for r in requests:
                self.model.cancel(r)
            self.outstanding -= len(requests)
            self.background -= background
            raise unavailable(exc) from None
        return Generation(self.model, requests, queue)

    async def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """Pooled vectors for every input (packed into batches with other requests)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()

        def settle(vectors: np.ndarray | None, error: EngineError | None) -> None:
            if future.done():
                return
            if isinstance(error, BackendUnavailable):
                future.set_exception(APIError(f"Embedding failed: {error}", status=503,
                                              code="backend_unavailable"))
            elif error is not None:
                future.set_exception(APIError(f"Embedding failed: {error}", status=500,
                                              code="engine_error"))
            else:
                assert vectors is not None
                future.set_result(vectors)

        def done(vectors: np.ndarray | None, error: EngineError | None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, vectors, error)

        job = EmbedJob(inputs, done)
        try:
            self.model.submit_embed(job)
        except EngineError as exc:
            raise unavailable(exc) from None
        try:
            return await future
        finally:
            job.cancelled = True  # a client that left: later batches skip it
