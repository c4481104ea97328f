"""A load client light enough not to be the bottleneck of a fast server.

Raw asyncio sockets, HTTP/1.1 keep-alive, one connection per concurrent client, and the
least parsing that tells tokens apart: streamed events are counted by their ``data:``
lines, nothing is decoded as JSON but the last one. C clients each send ``--requests``
``/v1/completions`` requests of exactly ``--tokens`` tokens (``ignore_eos``) back to back.
Prints one JSON object: tokens, wall seconds, TTFT and inter-token latencies (streaming),
and the client's own CPU seconds, so a report can show the client was not saturated.

    python bench/light_client.py --port 8000 --concurrency 16 --tokens 128 --stream
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import time


def _request(port: int, body: bytes) -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


async def _headers(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """The status and headers; EOFError if the server closed the connection."""
    line = b"\r\n"
    while line == b"\r\n":  # a stray line end left after the previous body
        line = await reader.readline()
    if not line:
        raise EOFError
    status = int(line.split(b" ", 2)[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        key, _, value = line.partition(b":")
        headers[key.strip().lower()] = value.strip()
    return status, headers


async def _body_chunks(reader: asyncio.StreamReader, headers: dict[bytes, bytes]):  # type: ignore[no-untyped-def]
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    else:
        yield await reader.readexactly(int(headers[b"content-length"]))


class Stats:
    def __init__(self) -> None:
        self.tokens = 0
        self.requests = 0
        self.errors = 0
        self.ttft: list[float] = []
        self.itl: list[float] = []


async def client(port: int, body: bytes, stream: bool, requests: int, tokens: int,
                 stats: Stats) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = _request(port, body)
    try:
        for _ in range(requests):
            started = time.perf_counter()
            writer.write(raw)
            try:
                status, headers = await _headers(reader)
            except (EOFError, ConnectionError):  # closed after the last response: reconnect
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                started = time.perf_counter()
                writer.write(raw)
                status, headers = await _headers(reader)
            last = None
            events = 0
            tail = b""
            async for chunk in _body_chunks(reader, headers):
                if not stream:
                    continue
                now = time.perf_counter()
                data = tail + chunk
                lines = data.split(b"\n")
                tail = lines.pop()
                n = sum(1 for line in lines if line.startswith(b"data: {"))
                if n:
                    if last is None:
                        stats.ttft.append(now - started)
                    else:
                        stats.itl.append((now - last) / n)
                    last = now
                    events += n
            if status != 200:
                stats.errors += 1
                continue
            stats.requests += 1
            stats.tokens += tokens
            if headers.get(b"connection", b"").lower() == b"close":
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
    finally:
        writer.close()


async def run(port: int, concurrency: int, tokens: int, requests: int, stream: bool,
              prompt: str) -> dict[str, float]:
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "ignore_eos": True,
                       "stream": stream, "n_predict": tokens}).encode()
    stats = Stats()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await asyncio.gather(*(client(port, body, stream, requests, tokens, stats)
                           for _ in range(concurrency)))
    wall = time.perf_counter() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)

    def pct(values: list[float], q: float) -> float:
        if not values:
            return 0.0
        return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]

    return {"tokens": stats.tokens, "requests": stats.requests, "errors": stats.errors,
            "wall": wall, "tok_s": stats.tokens / wall if wall else 0.0,
            "ttft_p50": statistics.median(stats.ttft) if stats.ttft else 0.0,
            "itl_p50": statistics.median(stats.itl) if stats.itl else 0.0,
            "itl_p99": pct(stats.itl, 99), "client_cpu": cpu, "client_cpu_share": cpu / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=4, help="per client, back to back")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--prompt", default="Once upon a time")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args.port, args.concurrency, args.tokens, args.requests,
                                     args.stream, args.prompt))))


if __name__ == "__main__":
    main()
