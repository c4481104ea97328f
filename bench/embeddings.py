"""Embeddings per second for 256 short sentences, packed three ways, at concurrency 16.

  1 x 256   one request holding all 256 sentences
  16 x 16   16 requests of 16 sentences
  256 x 1   256 requests of one sentence

on all-MiniLM-L6-v2 (GGUF made by llamaserve pull), for llamaserve and, with
``--llama-server``, llama.cpp's llama-server (``--embedding``) on the same file, one
server at a time. Prints one table; the last column is llamaserve / llama-server.

    python bench/embeddings.py [--llama-server /path/to/llama-server]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from compare_servers import _port, _wait  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import report  # noqa: E402

SUBJECTS = ["The committee", "A small dog", "Our new parser", "The river", "My neighbour",
            "This library", "The old bridge", "A sudden storm"]
VERBS = ["approved", "chased", "rejected", "crossed", "painted", "indexed", "survived", "delayed"]
OBJECTS = ["the budget.", "a red ball.", "the malformed input.", "the valley.", "the fence.",
           "every document.", "the winter.", "the morning train."]
SHAPES = [(1, 256), (16, 16), (256, 1)]


def sentences(n: int = 256) -> list[str]:
    return [f"{SUBJECTS[i % 8]} {VERBS[i // 8 % 8]} {OBJECTS[i // 64 % 8]} (#{i})"
            for i in range(n)]


async def run_shape(url: str, texts: list[str], n_requests: int, per_request: int,
                    concurrency: int) -> float:
    """Embeddings per second for the whole set, sent as n_requests of per_request."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        async def one(i: int) -> None:
            body = {"model": "bench", "input": texts[i * per_request:(i + 1) * per_request],
                    "encoding_format": "float"}
            async with sem:
                r = await http.post(f"{url}/v1/embeddings", json=body)
                r.raise_for_status()
                assert len(r.json()["data"]) == per_request

        await one(0)  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n_requests)))
        return len(texts) / (time.perf_counter() - start)


def start_llamaserve(model: str, threads: int, port: int, tmp: Path) -> subprocess.Popen[bytes]:
    cfg = json.loads((ROOT / "configs" / "all-minilm-l6-v2.json").read_text())
    cfg["server"] = {"log_level": "warning"}
    cfg["model"].update({"path": model, "alias": "bench", "threads": threads,
                         "threads_batch": threads})
    path = tmp / "embed-bench.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def start_llama_server(binary: str, model: str, threads: int, port: int
                       ) -> subprocess.Popen[bytes]:
    return subprocess.Popen([binary, "-m", model, "--port", str(port), "--embedding",
                             "--pooling", "mean", "-np", "16", "-c", "8192", "-b", "2048",
                             "-ub", "2048", "-t", str(threads), "-tb", str(threads),
                             "--no-webui"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--model", default=str(model_path("minilm")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    texts = sentences()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        servers = [("llamaserve", lambda port: start_llamaserve(
            args.model, args.threads, port, Path(tmp)))]
        if args.llama_server:
            servers.append(("llama-server", lambda port: start_llama_server(
                args.llama_server, args.model, args.threads, port)))
        for name, start in servers:
            port = _port()
            proc = start(port)
            try:
                _wait(f"http://127.0.0.1:{port}/health", proc)
                results[name] = {}
                for n_req, per in SHAPES:
                    best = max(asyncio.run(run_shape(f"http://127.0.0.1:{port}", texts, n_req,
                                                     per, args.concurrency))
                               for _ in range(args.rounds))
                    results[name][f"{n_req} x {per}"] = best
                    print(f"{name} {n_req}x{per}: {best:.0f}/s", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(30)
    rows: list[dict[str, object]] = []
    for n_req, per in SHAPES:
        shape = f"{n_req} x {per}"
        row: dict[str, object] = {"requests x inputs": shape}
        for name, by_shape in results.items():
            row[f"{name} emb/s"] = round(by_shape[shape])
        if "llama-server" in results:
            row["ratio"] = round(results["llamaserve"][shape]
                                 / max(results["llama-server"][shape], 1e-9), 2)
        rows.append(row)
    report(rows, "embeddings")


if __name__ == "__main__":
    main()
