"""Time to first token of one request at a time, where decoding is cheap: what a server adds
around the arithmetic before the first token reaches the client.

The tiny model of bench/step_overhead.py (real tokenizer and template, ``llama_decode`` well
under a millisecond), llamaserve and llama-server up at once with the same threads, and a
client on a raw socket (no HTTP library in the measurement): a streamed request with
``max_tokens`` 1, timed from the request's first byte sent to the first SSE event carrying
a token (for chat: the event after the role's). ``--blocks`` blocks of ``--requests``
requests, each server's block in turn (a server's block right after another's would
otherwise pay for the other's spinning threads); the figure is the median over blocks of
each block's median, so machine drift moves every server alike.

    python bench/first_token.py --llama-server /tmp/llama-build/bin/llama-server
    python bench/first_token.py --llama-server ... --against /tmp/old-checkout

``--against DIR``: one more llamaserve, started from another checkout (before and after a
change, in one run). Writes bench/results/first_token.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from make_tiny_model import write_tiny_model  # noqa: E402
from step_overhead import start_llama_server, start_llamaserve  # noqa: E402

from report import report  # noqa: E402

ROUTES = {
    "completions": ("/v1/completions", lambda text: {"prompt": text}, 1),
    "chat": ("/v1/chat/completions",
             lambda text: {"messages": [{"role": "user", "content": text}]}, 2),
}


def first_token_ms(port: int, route: str, text: str) -> float:
    """One streamed request: milliseconds from sending it to the event with its token."""
    path, shape, nth_event = ROUTES[route]
    body = json.dumps({**shape(text), "max_tokens": 1, "stream": True}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        sock.sendall(head + body)
        seen, first = b"", 0.0
        while chunk := sock.recv(65536):
            seen += chunk
            if not first and seen.count(b"data: {") >= nth_event:
                first = time.perf_counter() - started
        if not first:
            raise RuntimeError(f"no token event from port {port}: {seen[:300]!r}")
    return first * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", default="llama-server")
    ap.add_argument("--model", default=None, help="default: the tiny model (written if missing)")
    ap.add_argument("--routes", default="completions,chat")
    ap.add_argument("--text", default="Once upon a time")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--requests", type=int, default=400, help="per block")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--against", default=None, metavar="DIR",
                    help="one more llamaserve, from another checkout")
    args = ap.parse_args()
    model = args.model or str(write_tiny_model())
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        servers: dict[str, tuple[Any, int]] = {}
        try:
            servers["llamaserve"] = start_llamaserve(model, args.threads, 8192, Path(tmp))
            if args.against:
                servers["against"] = start_llamaserve(model, args.threads, 8192, Path(tmp),
                                                      root=Path(args.against))
            servers["llama-server"] = start_llama_server(args.llama_server, model,
                                                         args.threads, 8192, Path(tmp))
            for route in args.routes.split(","):
                blocks: dict[str, list[list[float]]] = {name: [] for name in servers}
                for _, port in servers.values():  # warm up
                    for _ in range(20):
                        first_token_ms(port, route, args.text)
                for _ in range(args.blocks):
                    for name, (_, port) in servers.items():
                        blocks[name].append([first_token_ms(port, route, args.text)
                                             for _ in range(args.requests)])
                for name, runs in blocks.items():
                    every = sorted(ms for run in runs for ms in run)
                    rows.append({
                        "route": route, "server": name,
                        "TTFT ms (median of block medians)": round(statistics.median(
                            statistics.median(run) for run in runs), 2),
                        "p10": round(every[len(every) // 10], 2),
                        "p90": round(every[len(every) * 9 // 10], 2),
                        "requests": len(every)})
                theirs = next(r for r in rows if r["route"] == route
                              and r["server"] == "llama-server")
                for r in [r for r in rows if r["route"] == route
                          and r["server"] != "llama-server"]:
                    rows.append({"route": route, "server": f"{r['server']} / llama-server",
                                 "TTFT ms (median of block medians)": round(
                                     r["TTFT ms (median of block medians)"]
                                     / theirs["TTFT ms (median of block medians)"], 2),
                                 "p10": "", "p90": "", "requests": ""})
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)
    report(rows, "first_token")


if __name__ == "__main__":
    main()
