"""api/web/streaming.py's BeatingResponse, driven as an ASGI app on plain async generators:
beats only in silences and only between chunks, chunks in order, none after the end, the
source's errors raised, the source never read ahead of the client and stopped when the
client leaves."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from api.web.engine_client import INLINE_CHARS, INLINE_TEXTS, EngineClient
from api.web.streaming import BeatingResponse, ClientLeft, TextEvent, sse, unless_client_leaves


async def timed(*steps: tuple[float, bytes]) -> AsyncIterator[bytes]:
    for delay, chunk in steps:
        await asyncio.sleep(delay)
        yield chunk


async def serve(response: BeatingResponse, send_delay: float = 0.0,
                leave_after: float | None = None) -> list[Any]:
    """The messages the app sends (bodies as bytes, the end as None); a client that takes
    ``send_delay`` per message, or leaves after ``leave_after`` seconds."""
    sent: list[Any] = []
    left = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if leave_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(leave_after or 0)
        left.set()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"] if message["more_body"] else None)
        await asyncio.sleep(send_delay)

    await response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
    return sent


def collect(source: AsyncIterator[bytes], seconds: float) -> list[Any]:
    return asyncio.run(serve(BeatingResponse(source, seconds, b".")))


def test_beats_fill_silences_and_chunks_keep_their_order() -> None:
    out = collect(timed((0.35, b"a"), (0.0, b"b"), (0.25, b"c")), 0.1)
    assert out[-1] is None and None not in out[:-1]  # the end last, nothing after it
    assert [c for c in out[:-1] if c != b"."] == [b"a", b"b", b"c"]
    assert 2 <= out.index(b"a") <= 4  # about three beats in the first 0.35 s
    between = out[out.index(b"b") + 1:out.index(b"c")]
    assert 1 <= len(between) <= 3 and set(between) == {b"."}
    assert collect(timed((0.0, b"x"), (0.0, b"y")), 0.1) == [b"x", b"y", None]  # no silence
    assert collect(timed((0.25, b"x")), 0) == [b"x", None]  # 0 turns it off


def test_an_error_of_the_source_is_raised_after_its_chunks() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"a"
        raise RuntimeError("engine failed")

    sent: list[Any] = []

    async def run() -> None:
        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                sent.append(message["body"])

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        await BeatingResponse(failing(), 0.1)({"type": "http"}, receive, send)

    with pytest.raises(Exception, match="engine failed"):
        asyncio.run(run())
    assert sent == [b"a"]


def test_the_source_is_not_read_ahead_and_stops_when_the_client_leaves() -> None:
    read: list[int] = []

    async def run() -> tuple[list[Any], bool]:
        done = asyncio.Event()

        async def source() -> AsyncIterator[bytes]:
            try:
                for i in range(100):
                    read.append(i)
                    yield b"%d" % i
                await asyncio.sleep(10)
            finally:
                done.set()

        # a client that takes 0.05 s per message and leaves after 0.2 s
        sent = await serve(BeatingResponse(source(), 5), send_delay=0.05, leave_after=0.2)
        return sent, done.is_set()

    sent, stopped_source = asyncio.run(run())
    assert stopped_source and len(read) <= len(sent) + 1 <= 7


def test_unless_client_leaves_returns_cancels_and_passes_outside_cancels_on() -> None:
    """The work's result when the client stays; ``ClientLeft`` and the work cancelled when
    it leaves, with the task usable afterwards (a later timeout still works); a cancel
    from elsewhere stays a cancel; no listener is left behind."""

    def receive_after(seconds: float | None) -> Any:
        async def receive() -> dict[str, Any]:
            await asyncio.sleep(3600 if seconds is None else seconds)
            return {"type": "http.disconnect"}
        return receive

    async def work(seconds: float, cancelled: list[bool]) -> str:
        try:
            await asyncio.sleep(seconds)
            return "done"
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def run() -> None:
        stays: list[bool] = []
        assert await unless_client_leaves(receive_after(None), work(0.01, stays)) == "done"
        assert not stays
        leaves: list[bool] = []
        with pytest.raises(ClientLeft):
            await unless_client_leaves(receive_after(0.01), work(5, leaves))
        assert leaves == [True]
        task_now = asyncio.current_task()
        assert getattr(task_now, "cancelling", lambda: 0)() == 0  # not still cancelling
        outside: list[bool] = []
        task = asyncio.ensure_future(unless_client_leaves(receive_after(None), work(5, outside)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert outside == [True]
        await asyncio.sleep(0)
        current = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t is not current] == []

    asyncio.run(run())


def test_a_few_short_texts_are_tokenized_on_the_event_loop_others_on_the_pool() -> None:
    class Model:
        n_seq_max = 1

    async def where(client: EngineClient, texts: list[str]) -> str:
        return (await client.tokenize(threading.current_thread, texts=texts)).name

    async def run() -> list[str]:
        client = EngineClient(Model())  # type: ignore[arg-type]
        try:
            return [await where(client, ["x" * INLINE_CHARS]),
                    await where(client, ["x" * (INLINE_CHARS // 2)] * 2),
                    await where(client, ["x" * (INLINE_CHARS + 1)]),
                    await where(client, [""] * (INLINE_TEXTS + 1))]  # many, however short
        finally:
            client.executor.shutdown()

    loop_thread = threading.current_thread().name
    inline, inline_two, long, many = asyncio.run(run())
    assert inline == inline_two == loop_thread
    assert long.startswith("llamaserve-prepare") and many.startswith("llamaserve-prepare")


@pytest.mark.parametrize("text", ["", "hello", ' "quoted" \\ back', "line\nbreak\ttab",
                                  "\x00\x1f control", "héllo wörld — ✓ 日本 🦙", "</script>"])
def test_a_text_event_is_byte_for_byte_the_payloads_sse(text: str) -> None:
    payload = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m ✓",
               "choices": [{"text": TextEvent.SLOT, "index": 0, "logprobs": None,
                            "finish_reason": None}]}
    event = TextEvent(payload)
    expected = sse({**payload, "choices": [{**payload["choices"][0], "text": text}]})
    assert event(text) == expected
