"""Time to first token with a long shared system prompt: cold vs warm vs after a restart.

For each server (llamaserve with its disk cache; llama.cpp's llama-server when
``--llama-server`` is given), on Qwen2.5-Coder-0.5B-Instruct by default:

  cold     first request with a ~2,000-token system prompt and a short question
  warm     same system prompt, a different question (memory prefix cache)
  restart  the server is restarted, then a third question (disk cache for llamaserve;
           llama-server has no automatic disk tier)

Each phase runs once per system prompt (``--prompts`` different ones) and is averaged.
Prints one table with TTFT in ms and the ratios warm/cold and restart/cold.

    python bench/prefix_cache.py [--llama-server /path/to/llama-server]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from compare_servers import _port, _wait, start_llama_server  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import Chart, report  # noqa: E402

TOPICS = ["rivers", "bridges", "compilers", "violins", "glaciers", "tea", "comets", "looms"]
QUESTIONS = ["What about rivers?", "Tell me about looms.", "And violins?"]


def system_prompt(words: int, salt: str) -> str:
    lines, n, i = [f"You are the {salt} assistant. Follow these house rules."], 0, 0
    while n < words:
        line = (f"Rule {i + 1}: when the user asks about {TOPICS[i % len(TOPICS)]}, answer in "
                f"one short sentence and cite {salt} item number {i * 7 % 97}.")
        lines.append(line)
        n += len(line.split())
        i += 1
    return "\n".join(lines)


PROMPT_TOKENS: list[int] = []


def ttft(url: str, system: str, question: str) -> float:
    """Seconds from sending a streamed chat request to its first content token."""
    body = {"model": "bench", "stream": True, "max_tokens": 8, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}
    start = time.perf_counter()
    elapsed = 0.0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if not elapsed and choices and choices[0].get("delta", {}).get("content"):
                elapsed = time.perf_counter() - start
            if chunk.get("usage"):
                PROMPT_TOKENS.append(chunk["usage"]["prompt_tokens"])
    if not elapsed:
        raise RuntimeError("no content token")
    return elapsed


def start_llamaserve(model: str, threads: int, port: int, tmp: Path,
                     disk: Path) -> subprocess.Popen[bytes]:
    cfg = {"server": {"log_level": "warning"},
           "model": {"path": model, "alias": "bench", "n_ctx": 8192, "n_seq_max": 4,
                     "n_batch": 512, "n_ubatch": 512, "threads": threads,
                     "threads_batch": threads, "kv_unified": True},
           "disk_cache": {"path": str(disk), "max_bytes": 4 << 30, "min_tokens": 128}}
    path = tmp / "prefix-bench.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def measure(start: Callable[[int], subprocess.Popen[bytes]], prompts: list[str]
            ) -> dict[str, float]:
    def boot() -> tuple[subprocess.Popen[bytes], str]:
        port = _port()
        proc = start(port)
        url = f"http://127.0.0.1:{port}"
        _wait(f"{url}/health", proc)
        ttft(url, "You are brief.", "Say hi.")  # warm-up: first graph allocation
        return proc, url

    times: dict[str, list[float]] = {"cold": [], "warm": [], "restart": []}
    proc, url = boot()
    try:
        for system in prompts:
            times["cold"].append(ttft(url, system, QUESTIONS[0]))
            times["warm"].append(ttft(url, system, QUESTIONS[1]))
    finally:
        proc.terminate()  # SIGTERM: llamaserve flushes its disk writer
        proc.wait(60)
    proc, url = boot()
    try:
        for system in prompts:
            times["restart"].append(ttft(url, system, QUESTIONS[2]))
    finally:
        proc.terminate()
        proc.wait(60)
    return {k: statistics.mean(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--model", default=str(model_path("qwen-0.5b")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--words", type=int, default=1450, help="system prompt size (~2,000 tokens)")
    ap.add_argument("--prompts", type=int, default=2)
    args = ap.parse_args()
    prompts = [system_prompt(args.words, f"house-{i}") for i in range(args.prompts)]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        servers: list[tuple[str, Callable[[int], subprocess.Popen[bytes]]]] = [
            ("llamaserve (memory + disk)", lambda port: start_llamaserve(
                args.model, args.threads, port, Path(tmp), Path(tmp) / "disk"))]
        if args.llama_server:
            servers.append(("llama-server", lambda port: start_llama_server(
                args.llama_server, args.model, 4, 8192, args.threads, port)))
        for name, start in servers:
            t = measure(start, prompts)
            rows.append({"server": name, "prompt tokens": max(PROMPT_TOKENS),
                         "cold ms": round(t["cold"] * 1000),
                         "warm ms": round(t["warm"] * 1000),
                         "warm/cold": round(t["warm"] / t["cold"], 4),
                         "after restart ms": round(t["restart"] * 1000),
                         "restart/cold": round(t["restart"] / t["cold"], 4)})
            print(f"{name}: {rows[-1]}", file=sys.stderr)
    report(rows, "prefix_cache", Chart(
        "server", ["cold ms", "warm ms", "after restart ms"], "time to first token (ms)",
        f"A ~{max(PROMPT_TOKENS)}-token system prompt: cold, warm, after a restart", log=True))


if __name__ == "__main__":
    main()
