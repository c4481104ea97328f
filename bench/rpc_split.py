"""One model across machines, on one machine: what llama.cpp's RPC backend costs (CPU,
loopback, Qwen2.5-Coder-0.5B).

Servers in turn, same model and threads:

- local: every layer on this process's CPU (and again with ``OMP_WAIT_POLICY=passive``);
- 2 RPC servers: every layer offloaded (``n_gpu_layers`` -1), split evenly over two
  ``llamaserve rpc-server`` processes on 127.0.0.1 (the input embeddings stay local);
- local + 2 RPC: 9 of 24 layers here, the other 15 and the output layer split over the two
  servers (the layout of tests/test_rpc.py).

For each: prompt evaluation (a ~1,500-token prompt, ``cache_prompt: false``, one token
generated: prompt tokens / time to first token) and single-stream decode (128 tokens,
greedy, ``ignore_eos``: tokens / time between the first and the last streamed token);
median of ``--rounds``, the ratio to local, and how many of the 128 greedy tokens equal
local serving's before the first difference. The layers run one after another, so on
loopback the split only adds the transfers and round trips; the figures say nothing about
GPUs or real networks.

The rpc-servers and the split servers run with ``OMP_WAIT_POLICY=passive``
(``--omp-wait``): three processes of 2 OpenMP threads on 2 cores spin-wait for each
other's preempted threads otherwise, and decode fell to 0.4-1 tokens/s on this machine.
On separate machines that cannot happen; local serving is measured both ways, the ratios
are to its default (active waiting).

    flock /tmp/llamaserve-bench.lock python bench/rpc_split.py

Prints the table and writes bench/results/rpc_split.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from conftest import (  # noqa: E402
    RpcServerProcess,
    ServerProcess,
    qwen_config,
    start_rpc_server,
    start_server,
)
from report import Chart, report  # noqa: E402

PROMPT = "Summarize the following log.\n" + "".join(
    f"2024-05-{i % 28 + 1:02d} 12:{i % 60:02d}:07 worker-{i % 7} finished job {i * 37 % 1000} "
    f"in {i % 13 + 1}.{i % 10} s with status {'ok' if i % 5 else 'retry'}\n"
    for i in range(40))


def prompt_rate(server: ServerProcess) -> tuple[float, int]:
    """(prompt tokens per second, prompt tokens) from the time to the first token."""
    body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "cache_prompt": False,
            "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = None
    tokens = 0
    with httpx.stream("POST", f"{server.base_url}/completions", json=body,
                      timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["prompt_tokens"]
    assert first is not None and tokens
    return tokens / (first - started), tokens


def decode_rate(server: ServerProcess, n: int) -> tuple[float, list[str]]:
    """(generated tokens per second after the first, the tokens) of one greedy stream."""
    body = {"prompt": "def parse_config(path):", "max_tokens": n, "temperature": 0,
            "ignore_eos": True, "stream": True}
    stamps: list[float] = []
    parts: list[str] = []
    with httpx.stream("POST", f"{server.base_url}/completions", json=body,
                      timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                if choice["text"]:
                    stamps.append(time.perf_counter())
                    parts.append(choice["text"])
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), parts


def config(threads: int, rpc: list[RpcServerProcess], **model: Any) -> dict[str, Any]:
    cfg = qwen_config(n_ctx=2048, n_seq_max=1, threads=threads, threads_batch=threads,
                      **model)
    if rpc:
        cfg["model"].update(rpc_servers=[s.endpoint for s in rpc], tensor_split=[1, 1])
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128, help="decoded tokens per round")
    ap.add_argument("--threads", type=int, default=2,
                    help="threads of the server and of each rpc-server")
    ap.add_argument("--omp-wait", choices=["passive", "active"], default="passive",
                    help="OMP_WAIT_POLICY of the rpc-servers and the split servers")
    args = ap.parse_args()
    passive = {"OMP_WAIT_POLICY": args.omp_wait}
    rows: list[dict[str, Any]] = []
    texts: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rpc = [start_rpc_server(tmp, args.threads, passive),
               start_rpc_server(tmp, args.threads, passive)]
        try:
            setups = [("local", config(args.threads, []), {}),
                      ("local, passive", config(args.threads, []), passive),
                      ("2 RPC servers", config(args.threads, rpc), passive),
                      ("local + 2 RPC", config(args.threads, rpc, n_gpu_layers=16), passive)]
            for name, cfg, env in setups:
                server = start_server(cfg, tmp, env=env)
                try:
                    decode_rate(server, 8)  # warm-up
                    prompts = [prompt_rate(server) for _ in range(args.rounds)]
                    decodes = [decode_rate(server, args.tokens) for _ in range(args.rounds)]
                finally:
                    server.stop()
                texts[name] = decodes[0][1]
                rows.append({"setup": name, "prompt tokens": prompts[0][1],
                             "prompt tok/s": round(statistics.median(p for p, _ in prompts), 1),
                             "decode tok/s": round(statistics.median(d for d, _ in decodes), 1)})
        finally:
            for s in rpc:
                s.kill()
    local = rows[0]
    for row in rows:
        row["prompt vs local"] = round(row["prompt tok/s"] / local["prompt tok/s"], 2)
        row["decode vs local"] = round(row["decode tok/s"] / local["decode tok/s"], 2)
        mine, theirs = texts[row["setup"]], texts["local"]
        same = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False))
                     if a != b), min(len(mine), len(theirs)))
        row["tokens as local"] = f"{same}/{len(theirs)}"
    report(rows, "rpc_split", Chart("setup", ["prompt tok/s", "decode tok/s"], "tokens/s"))


if __name__ == "__main__":
    main()
