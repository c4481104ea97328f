"""Slow and many clients against a real server (Gemma 3 270M, n_seq_max 4).

1. Stalled stream: 3 streams generate while a 4th client opens a stream and stops
   reading for --stall seconds. Reports the other streams' tokens/s next to a run with
   no stalled client, the server's RSS during the stall, and when the stalled request
   was cancelled (server.max_buffered_steps).
2. Idle connections: --idle WebSocket and --idle keep-alive HTTP connections held open;
   reports the server's RSS before and after, per connection, and that a request past
   server.max_connections gets a 503 error object.
3. Slowloris: 50 clients sending header bytes slowly while a normal client runs requests;
   reports their latency and when the slow ones were cut.

    flock /tmp/llamaserve-bench.lock python bench/slow_clients.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import ServerProcess, gemma_config, start_server  # noqa: E402

LONG = {"prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 400,
        "ignore_eos": True, "temperature": 0, "stream": True}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def stream_tokens(url: str, out: list[float]) -> None:
    """Stream LONG; append tokens/s (chunks with text) measured from the first chunk."""
    n, first = 0, None
    with httpx.stream("POST", url, json=LONG, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                first = first or time.monotonic()
                n += 1
    if first is not None:
        out.append(n / (time.monotonic() - first))


def others(server: ServerProcess, stalled: bool, stall: float) -> dict[str, Any]:
    url = server.base_url + "/completions"
    rates: list[float] = []
    sock = None
    if stalled:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        body = json.dumps({**LONG, "max_tokens": 2000, "n": 1}).encode()
        sock.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    threads = [threading.Thread(target=stream_tokens, args=(url, rates)) for _ in range(3)]
    started = time.monotonic()
    rss = [rss_kib(server.proc.pid)]
    for t in threads:
        t.start()
    cancelled_at = None
    while any(t.is_alive() for t in threads) or (stalled and time.monotonic() - started < stall):
        time.sleep(0.5)
        rss.append(rss_kib(server.proc.pid))
        if stalled and cancelled_at is None and server.metrics().get(
                "llamaserve_slow_client_cancels_total", 0) > 0:
            cancelled_at = time.monotonic() - started
    if sock is not None:
        sock.close()
    return {"rates": rates, "rss_min": min(rss), "rss_max": max(rss),
            "cancelled_after": cancelled_at}


async def hold_idle(port: int, n_ws: int, n_http: int) -> tuple[list[Any], list[Any]]:
    from websockets.asyncio.client import connect

    sockets = []
    for i in range(n_ws):
        sockets.append(await connect(f"ws://127.0.0.1:{port}/v1/responses"))
        if i % 100 == 99:
            await asyncio.sleep(0)
    writers = []
    for _ in range(n_http):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await reader.readuntil(b"}")  # served; the connection stays open (keep-alive)
        writers.append((reader, writer))
    return sockets, writers


def idle_connections(server: ServerProcess, n: int, max_connections: int) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    before = rss_kib(server.proc.pid)
    ws_only = None
    sockets, writers = loop.run_until_complete(hold_idle(server.port, n, 0))
    time.sleep(1)
    ws_only = rss_kib(server.proc.pid)
    _, writers = loop.run_until_complete(hold_idle(server.port, 0, n))
    time.sleep(1)
    both = rss_kib(server.proc.pid)
    over = httpx.get(f"{server.url}/healthz", timeout=10)
    result = {"before": before, "ws": ws_only, "both": both,
              "over_status": over.status_code, "over_body": over.text[:160],
              "open": len(sockets) + len(writers), "max_connections": max_connections}

    async def close() -> None:
        for s in sockets:
            await s.close()
        for _, w in writers:
            w.close()

    loop.run_until_complete(close())
    loop.close()
    return result


def slowloris(server: ServerProcess, n: int, header_timeout: float) -> dict[str, Any]:
    cut: list[float] = []

    def drip() -> None:
        s = socket.create_connection(("127.0.0.1", server.port))
        started = time.monotonic()
        try:
            for b in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                s.send(bytes([b]))
                time.sleep(0.5)
        except OSError:
            pass
        cut.append(time.monotonic() - started)
        s.close()

    threads = [threading.Thread(target=drip, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    latencies = []
    end = time.monotonic() + header_timeout + 2
    while time.monotonic() < end:
        t0 = time.monotonic()
        r = httpx.post(server.base_url + "/completions", timeout=30,
                       json={"prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200
        latencies.append(time.monotonic() - t0)
    for t in threads:
        t.join(header_timeout + 10)
    return {"latency_max": max(latencies), "latency_mean": sum(latencies) / len(latencies),
            "requests": len(latencies), "cut": sorted(cut)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stall", type=float, default=60.0)
    ap.add_argument("--idle", type=int, default=1000)
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server inherits it
    max_connections = 2 * args.idle  # all held open: the next one is past the cap
    with tempfile.TemporaryDirectory() as tmp:
        cfg = gemma_config(n_seq_max=4)
        cfg["server"].update(max_connections=max_connections, header_timeout=10,
                             keep_alive_timeout=600, max_buffered_steps=128,
                             send_buffer_bytes=16384)
        server = start_server(cfg, Path(tmp))
        try:
            base = others(server, stalled=False, stall=0)
            stall = others(server, stalled=True, stall=args.stall)
            idle = idle_connections(server, args.idle, max_connections)
            loris = slowloris(server, 50, 10)
            healthy = httpx.get(f"{server.url}/healthz", timeout=10).status_code
        finally:
            server.stop()
    mean = sum(base["rates"]) / len(base["rates"])
    mean_s = sum(stall["rates"]) / len(stall["rates"])
    print("| run | other streams | tokens/s each (mean) | server RSS MiB (min-max) |")
    print("|---|---|---|---|")
    print(f"| no stalled client | 3 | {mean:.1f} | {base['rss_min'] / 1024:.0f}-"
          f"{base['rss_max'] / 1024:.0f} |")
    print(f"| 1 client stalled {args.stall:g} s | 3 | {mean_s:.1f} | "
          f"{stall['rss_min'] / 1024:.0f}-{stall['rss_max'] / 1024:.0f} |")
    print(f"stalled request cancelled after {stall['cancelled_after']} s "
          "(max_buffered_steps 128, send_buffer_bytes 16384)")
    per_ws = (idle["ws"] - idle["before"]) / args.idle
    per_http = (idle["both"] - idle["ws"]) / args.idle
    print(f"idle: {args.idle} WebSocket + {args.idle} keep-alive HTTP connections open; "
          f"RSS {idle['before'] / 1024:.0f} -> {idle['ws'] / 1024:.0f} -> "
          f"{idle['both'] / 1024:.0f} MiB: {per_ws:.1f} KiB per idle WebSocket, "
          f"{per_http:.1f} KiB per idle HTTP connection")
    print(f"request past max_connections ({idle['max_connections']}, {idle['open']} open): "
          f"{idle['over_status']} {idle['over_body']}")
    print(f"slowloris: 50 clients dripping headers, cut after "
          f"{loris['cut'][0]:.1f}-{loris['cut'][-1]:.1f} s (header_timeout 10); meanwhile "
          f"{loris['requests']} normal requests, latency mean {loris['latency_mean']:.2f} s, "
          f"max {loris['latency_max']:.2f} s; healthy after: {healthy == 200}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
