"""Scale-out on one machine: aggregate tokens/s of one replica vs two replicas behind
nginx (deploy/nginx.conf as shipped), each replica with one thread on a 2-core machine,
and for reference one replica given both threads.

Agent-like traffic: ``--sessions`` concurrent conversations, each ``--turns`` turns with
its own session key (x-session-id), a shared system prompt, ``--tokens`` generated per
turn (ignore_eos, so every configuration generates the same count). Reported per
configuration: aggregate generated tokens/s over the whole run, mean time to first token,
and how many turns each replica served (affinity keeps a session on one replica).

    flock /tmp/llamaserve-bench.lock python bench/replicas.py

Prints the table and writes bench/results/replicas.json. Needs Debian's nginx.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from nginx_proxy import start_nginx  # noqa: E402

from conftest import free_port, qwen_config, start_server  # noqa: E402
from report import Chart, report  # noqa: E402

SYSTEM = "You are a coding agent working in a Python repository. " + " ".join(
    f"Tool {i}: call it when the user asks about area {i}; answer briefly." for i in range(30))


def turn(url: str, key: str, messages: list[dict[str, str]], tokens: int) -> tuple[float, int,
                                                                                 str, str]:
    """One streamed turn: (TTFT s, generated tokens, answer, upstream)."""
    body = {"model": "qwen", "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0, "messages": messages, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = None
    text, generated = "", 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900,
                      headers={"x-session-id": key}) as r:
        r.raise_for_status()
        upstream = r.headers.get("x-upstream", "")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text += piece
            if chunk.get("usage"):
                generated = chunk["usage"]["completion_tokens"]
    return (first or time.perf_counter()) - started, generated, text, upstream


def run_load(url: str, sessions: int, turns: int, tokens: int) -> dict[str, Any]:
    ttfts: list[float] = []
    generated = 0
    upstreams: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def session(n: int) -> None:
        nonlocal generated
        messages = [{"role": "system", "content": SYSTEM}]
        try:
            for t in range(turns):
                messages.append({"role": "user",
                                 "content": f"Session {n}, step {t}: list the next change."})
                ttft, count, text, upstream = turn(url, f"session-{n}", messages, tokens)
                messages.append({"role": "assistant", "content": text})
                with lock:
                    ttfts.append(ttft)
                    generated += count
                    upstreams[upstream] = upstreams.get(upstream, 0) + 1
        except Exception as exc:  # reported, never hidden
            errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    threads = [threading.Thread(target=session, args=(n,)) for n in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(errors[:3])
    return {"wall": wall, "generated": generated, "ttft": ttfts, "upstreams": upstreams}


def replica_config(threads: int, n_seq: int) -> dict[str, Any]:
    return qwen_config(threads=threads, threads_batch=threads, n_seq_max=n_seq, n_ctx=8192)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    setups = [("1 replica x 1 thread", 1, 1), ("2 replicas x 1 thread", 2, 1),
              ("1 replica x 2 threads", 1, 2)]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name, count, threads in setups:
            # the same sequences in all: each replica holds every session it may serve
            replicas = [start_server(replica_config(threads, args.sessions), tmp)
                        for _ in range(count)]
            proxy = start_nginx(tmp / f"nginx-{count}-{threads}", free_port(),
                                [r.port for r in replicas])
            try:
                run_load(proxy.url, 2, 1, 4)  # warm-up: graphs reserved, pages touched
                result = run_load(proxy.url, args.sessions, args.turns, args.tokens)
            finally:
                proxy.stop()
                for r in replicas:
                    r.stop()
            rows.append({
                "setup": name, "tok/s": round(result["generated"] / result["wall"], 1),
                "total s": round(result["wall"], 1),
                "mean TTFT s": round(statistics.mean(result["ttft"]), 2),
                "turns per replica": "/".join(str(v) for v in sorted(
                    result["upstreams"].values(), reverse=True))})
            print(rows[-1], flush=True)
    base = float(rows[0]["tok/s"])  # type: ignore[arg-type]
    for row in rows:
        row["vs 1 replica"] = round(float(row["tok/s"]) / base, 2)  # type: ignore[arg-type]
    report(rows, "replicas", Chart("setup", ["tok/s"], "generated tokens/s (all sessions)"))


if __name__ == "__main__":
    main()
