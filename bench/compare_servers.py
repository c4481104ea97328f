"""Side-by-side throughput: llamaserve vs llama.cpp's llama-server, one run, one table.

Starts each server in turn on the same GGUF (never both at once), drives it with
bench/load.py at each concurrency, and prints tokens/s, TTFT, ITL and the ratio
llamaserve / llama-server.

    python bench/compare_servers.py --llama-server /path/to/llama-server

Build llama-server from the llama.cpp sources vendored in llama-cpp-python's sdist:
    pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-*.tar.gz -C /tmp/lcp
    cmake -S /tmp/lcp/llama_cpp_python-*/vendor/llama.cpp -B /tmp/llama-build \
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    cmake --build /tmp/llama-build --target llama-server -j2
On a CPU whose /proc/cpuinfo lists ``amx_tile`` add the flags ``.ci/run`` builds the bindings
with (``-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'``, the same for CXX):
a native build there dies with SIGILL on quantized models such as Gemma 3's Q4_K_M
(docs/BACKENDS.md#amx), while the tiny model's float weights never reach AMX.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from fetch_models import model_path  # noqa: E402
from load import run_level  # noqa: E402
from report import Chart, report  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("server did not start")


def start_llamaserve(model: str, n_seq: int, n_ctx: int, threads: int, port: int,
                     tmp: Path) -> subprocess.Popen[bytes]:
    cfg = {"server": {"log_level": "warning"},
           "model": {"path": model, "alias": "bench", "n_ctx": n_ctx, "n_seq_max": n_seq,
                     "n_batch": 512, "n_ubatch": 512, "threads": threads,
                     "threads_batch": threads, "kv_unified": True}}
    path = tmp / "bench.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def start_llama_server(binary: str, model: str, n_seq: int, n_ctx: int, threads: int,
                       port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([binary, "-m", model, "--port", str(port), "-np", str(n_seq), "-cb",
                             "-c", str(n_ctx), "-t", str(threads), "-tb", str(threads),
                             "-b", "512", "-ub", "512", "--kv-unified", "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=open(os.devnull if not os.environ.get(
                                "BENCH_LOG") else os.environ["BENCH_LOG"], "wb"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--model", default=str(model_path("gemma")))
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-seq", type=int, default=16)
    ap.add_argument("--n-ctx", type=int, default=8192)
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        servers = [("llamaserve", lambda port: start_llamaserve(
            args.model, args.n_seq, args.n_ctx, args.threads, port, Path(tmp)))]
        if args.llama_server:
            servers.append(("llama-server", lambda port: start_llama_server(
                args.llama_server, args.model, args.n_seq, args.n_ctx, args.threads, port)))
        for name, start in servers:
            port = _port()
            proc = start(port)
            try:
                _wait(f"http://127.0.0.1:{port}/health", proc)
                results[name] = {}
                for c in levels:
                    res = asyncio.run(run_level(f"http://127.0.0.1:{port}/v1", "bench", c,
                                                args.tokens, args.rounds))
                    results[name][c] = res.row()
                    print(f"{name} c={c}: {res.row()}", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(30)
    rows: list[dict[str, object]] = []
    for c in levels:
        row: dict[str, object] = {"concurrency": c}
        for name, by_level in results.items():
            r = by_level[c]
            row[f"{name} tok/s"] = r["tok_s"]
            row[f"{name} ttft ms"] = r["ttft_ms"]
            row[f"{name} itl ms"] = r["itl_ms"]
        if "llama-server" in results:
            row["ratio"] = round(results["llamaserve"][c]["tok_s"]
                                 / max(results["llama-server"][c]["tok_s"], 1e-9), 3)
        rows.append(row)
    report(rows, "compare_servers", Chart(
        "concurrency", [f"{n} tok/s" for n in results], "tokens/s (end to end)",
        "Serving throughput, same model and settings"))


if __name__ == "__main__":
    main()
