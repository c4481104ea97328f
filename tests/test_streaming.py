"""api/web/streaming.py's keep-alive wrapper, on plain async generators: beats only in
silences, chunks in order, the source's errors raised, the source stopped when the client
leaves, and never read more than one chunk ahead of the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from api.web.streaming import with_keepalive


async def timed(*steps: tuple[float, bytes]) -> AsyncIterator[bytes]:
    for delay, chunk in steps:
        await asyncio.sleep(delay)
        yield chunk


def collect(source: AsyncIterator[bytes], seconds: float) -> list[bytes]:
    async def run() -> list[bytes]:
        return [c async for c in with_keepalive(source, seconds, beat=b".")]
    return asyncio.run(run())


def test_beats_fill_silences_and_chunks_keep_their_order() -> None:
    out = collect(timed((0.35, b"a"), (0.0, b"b"), (0.25, b"c")), 0.1)
    assert [c for c in out if c != b"."] == [b"a", b"b", b"c"]
    assert 2 <= out.index(b"a") <= 4  # about three beats in the first 0.35 s
    between = out[out.index(b"b") + 1:out.index(b"c")]
    assert 1 <= len(between) <= 3 and set(between) == {b"."}
    assert collect(timed((0.0, b"x"), (0.0, b"y")), 0.1) == [b"x", b"y"]  # no silence
    assert collect(timed((0.05, b"x")), 0) == [b"x"]  # 0 turns it off


def test_an_error_of_the_source_is_raised_after_its_chunks() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"a"
        raise RuntimeError("engine failed")

    async def run() -> list[bytes]:
        got = []
        with pytest.raises(RuntimeError, match="engine failed"):
            async for c in with_keepalive(failing(), 0.1):
                got.append(c)
        return got

    assert asyncio.run(run()) == [b"a"]


def test_the_source_is_read_at_most_one_chunk_ahead_and_stopped_when_the_client_leaves(
        ) -> None:
    read: list[int] = []

    async def run() -> tuple[list[int], bool]:
        done = asyncio.Event()

        async def source() -> AsyncIterator[bytes]:
            try:
                for i in range(100):
                    read.append(i)
                    yield b"%d" % i
                await asyncio.sleep(10)
            finally:
                done.set()

        stream = with_keepalive(source(), 5)
        assert await anext(stream) == b"0"
        await asyncio.sleep(0.05)  # a client that does not read: the pump waits
        ahead = len(read)
        await stream.aclose()  # the client left
        await asyncio.sleep(0.05)
        return [ahead], done.is_set()

    ahead, stopped_source = asyncio.run(run())
    assert ahead[0] <= 2 and stopped_source
