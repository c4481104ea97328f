"""The Batch API against interactive traffic, one server, one table.

1. Interactive latency: ``--probes`` streamed chat requests one after another (greedy,
   ``--probe-tokens`` tokens), time to first token and mean inter-token latency, with no
   batch, then again while a large chat batch runs (goal: <= 1.2x).
2. Batch throughput: ``--lines`` chat lines (``--tokens`` tokens each, greedy) as a batch
   alone, against the same bodies sent as concurrent interactive requests (``--n-seq``
   at a time, the model's sequences) (goal: batch >= 0.9x).

Qwen2.5-Coder-0.5B-Instruct by default (``--tiny``: the random-weight tiny Qwen of the
tests, for a quick run).

    flock /tmp/llamaserve-bench.lock python bench/batch.py

Prints the table and writes bench/results/batch.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import ServerProcess, qwen_config, start_server, tiny_qwen_config  # noqa: E402
from report import report  # noqa: E402

# One client for the whole run: httpx builds an SSL context per client (~45 ms of CPU here),
# so a new client per status poll would take a third of a core from the server being timed.
HTTP = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=16))
POLL_SECONDS = 0.2

TOPICS = ["rivers", "bridges", "compilers", "violins", "glaciers", "markets", "lighthouses",
          "orchards", "satellites", "libraries", "volcanoes", "harbors"]


def body(i: int, tokens: int, model: str) -> dict[str, Any]:
    return {"model": model, "temperature": 0, "max_tokens": tokens,
            "messages": [{"role": "user", "content":
                          f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} "
                          f"(number {i})."}]}


def probe(server: ServerProcess, i: int, tokens: int, model: str) -> tuple[float, float]:
    """(TTFT, mean inter-token latency) of one streamed request, seconds."""
    started = time.perf_counter()
    stamps: list[float] = []
    with HTTP.stream("POST", f"{server.base_url}/chat/completions",
                      json={**body(1000 + i, tokens, model), "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line.replace(" ", "") \
                    and '"content":""' not in line.replace(" ", ""):
                stamps.append(time.perf_counter())
    ttft = stamps[0] - started
    itl = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
    return ttft, itl


def probes(server: ServerProcess, n: int, tokens: int, model: str
           ) -> tuple[float, float, float]:
    """Median TTFT, median ITL, and the first probe's TTFT."""
    runs = [probe(server, i, tokens, model) for i in range(n)]
    return (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
            runs[0][0])


def submit(server: ServerProcess, bodies: list[dict[str, Any]]) -> str:
    content = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                   "url": "/v1/chat/completions", "body": b}).encode() + b"\n"
                       for i, b in enumerate(bodies))
    f = HTTP.post(f"{server.base_url}/files", files={"file": ("in.jsonl", content)},
                  data={"purpose": "batch"}).json()
    batch = HTTP.post(f"{server.base_url}/batches", json={
        "input_file_id": f["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h"}).json()
    return str(batch["id"])


def status(server: ServerProcess, batch_id: str) -> dict[str, Any]:
    data: dict[str, Any] = HTTP.get(f"{server.base_url}/batches/{batch_id}").json()
    return data


def wait(server: ServerProcess, batch_id: str) -> dict[str, Any]:
    while (b := status(server, batch_id))["status"] not in ("completed", "failed",
                                                              "cancelled", "expired"):
        time.sleep(POLL_SECONDS)
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--lines", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--probes", type=int, default=6)
    ap.add_argument("--probe-tokens", type=int, default=32)
    args = ap.parse_args()
    cfg = (tiny_qwen_config if args.tiny else qwen_config)(n_seq_max=args.n_seq)
    model = "tiny-qwen" if args.tiny else "qwen2.5-coder-0.5b-instruct"
    with tempfile.TemporaryDirectory() as tmp:
        cfg["server"] = {**cfg.get("server", {}), "batch_dir": f"{tmp}/batches"}
        server = start_server(cfg, Path(tmp))
        try:
            probe(server, 999, 4, model)  # warm-up
            ttft0, itl0, first0 = probes(server, args.probes, args.probe_tokens, model)
            # throughput, alternated against drift on a shared machine: the lines as
            # concurrent interactive requests, then other lines of the same shape as a batch
            interactive_s = batch_s = 0.0
            for r in range(args.rounds):
                start = 2 * r * args.lines
                bodies = [body(start + i, args.tokens, model) for i in range(args.lines)]
                started = time.perf_counter()
                with ThreadPoolExecutor(args.n_seq) as pool:
                    list(pool.map(lambda b: HTTP.post(f"{server.base_url}/chat/completions",
                                                      json=b), bodies))
                interactive_s += time.perf_counter() - started
                bodies = [body(start + args.lines + i, args.tokens, model)
                          for i in range(args.lines)]
                started = time.perf_counter()
                wait(server, submit(server, bodies))
                batch_s += time.perf_counter() - started
            # interactive latency while a large batch runs
            big = submit(server, [body(5000 + i, args.tokens, model)
                                  for i in range(args.lines * 4)])
            while status(server, big)["status"] == "validating":
                time.sleep(0.05)
            time.sleep(1.0)
            ttft1, itl1, first1 = probes(server, args.probes, args.probe_tokens, model)
            running = status(server, big)["status"] == "in_progress"
            HTTP.post(f"{server.base_url}/batches/{big}/cancel")
            wait(server, big)
        finally:
            server.stop()
    rows = [
        {"measure": "interactive TTFT (median, s)", "no batch": round(ttft0, 4),
         "batch running": round(ttft1, 4), "ratio": round(ttft1 / ttft0, 2), "goal": "<= 1.2"},
        {"measure": "first probe's TTFT (s)", "no batch": round(first0, 4),
         "batch running": round(first1, 4), "ratio": round(first1 / first0, 2),
         "goal": "(arrives at a full batch)"},
        {"measure": "interactive ITL (median, s)", "no batch": round(itl0, 4),
         "batch running": round(itl1, 4), "ratio": round(itl1 / itl0, 2), "goal": "<= 1.2"},
        {"measure": f"{args.rounds} x {args.lines} lines x {args.tokens} tokens (s)",
         "no batch": round(interactive_s, 2), "batch running": round(batch_s, 2),
         "ratio": round(interactive_s / batch_s, 2), "goal": ">= 0.9 (throughput)"},
    ]
    if not running:
        print("warning: the large batch finished before the probes did", file=sys.stderr)
    print(f"model {model}, n_seq_max {args.n_seq}; throughput row: 'no batch' = the lines as "
          f"{args.n_seq} concurrent interactive requests, 'batch running' = as a batch",
          file=sys.stderr)
    report(rows, "batch")


if __name__ == "__main__":
    main()
