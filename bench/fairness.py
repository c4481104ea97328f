"""Fairness under long prompts: streams decoding while long prompts arrive.

For each server in turn (llamaserve, then llama-server; never both at once) on the same
GGUF and settings: ``--streams`` clients stream completions back to back (``ignore_eos``);
for ``--idle`` seconds nothing else runs (idle inter-token latency), then ``--long-count``
prompts of ``--long-tokens`` tokens (each unique from its first word, so no prefix cache
helps) arrive ``--interval`` seconds apart, each asking for one token. The load window
runs from the first long prompt's arrival to the last one's first token. Reported: p50 /
p99 inter-token latency of the streams idle and under load, the long prompts' TTFT, and
llamaserve / llama-server ratios.

    flock /tmp/llamaserve-bench.lock python bench/fairness.py \\
        --llama-server /tmp/llama-build/bin/llama-server

``--targets 2,0`` runs llamaserve once per ``model.prefill_step_target`` (0: the fixed
``n_batch`` chunk, what the server did before), to show the ITL / TTFT trade-off.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from compare_servers import _port, _wait  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import Chart, report  # noqa: E402

_TEXT = ("the of and to in is that for it as with was on be by at this are from or have an "
         "they which one you had word but not what all were when we there can use each she "
         "how their if will up other about out many then them these so some her would make "
         "like him into time has look two more write go see number no way could people my "
         "than first water been call who oil its now find long down day did get come made "
         "may part over new sound take only little work know place year live me back give "
         "most very after thing our just name good sentence man think say great where help "
         "through much before line right too mean old any same tell boy follow came want "
         "show also around form three small set put end does another well large must big "
         "even such because turn here why ask went men read need land different home us "
         "move try kind hand picture again change off play spell air away animal house "
         "point page letter mother answer found study still learn should world high")


_WORDS = _TEXT.split()


def long_prompt(tokenize: Callable[[str], int], n_tokens: int, seed: int) -> str:
    """About ``n_tokens`` tokens of words, unique from the first word on."""
    rng = random.Random(seed)
    words = [f"Document {seed}:"]
    text = ""
    while True:
        words.extend(rng.choice(_WORDS) for _ in range(max(16, (n_tokens - len(words)) // 2)))
        text = " ".join(words)
        if tokenize(text) >= n_tokens:
            break
    while tokenize(text) > n_tokens:  # trim to the size
        words = words[:len(words) - max(1, (tokenize(text) - n_tokens) // 2)]
        text = " ".join(words)
    return text


@dataclass
class Run:
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (end time, gap seconds)
    first: dict[int, float] = field(default_factory=dict)  # stream -> its first token time
    ttft: list[float] = field(default_factory=list)
    errors: int = 0

    def itl(self, start: float, end: float) -> list[float]:
        return [g for t, g in self.gaps if start <= t <= end]


async def _stream(http: httpx.AsyncClient, url: str, i: int, tokens: int, run: Run,
                  stop: asyncio.Event) -> None:
    k = 0
    while not stop.is_set():
        body = {"model": "bench", "prompt": f"Story {i}-{k}: once upon a time, in a land",
                "max_tokens": tokens, "stream": True, "temperature": 0.8, "ignore_eos": True}
        k += 1
        last: float | None = None
        try:
            async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    run.errors += 1
                    await r.aread()
                    continue
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    choices = json.loads(line[6:]).get("choices") or []
                    if not choices or not choices[0].get("text"):
                        continue
                    now = time.perf_counter()
                    run.first.setdefault(i, now)
                    if last is not None:
                        run.gaps.append((now, now - last))
                    last = now
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            run.errors += 1


async def _long(http: httpx.AsyncClient, url: str, prompt: str, run: Run) -> float:
    body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "stream": True,
            "temperature": 0.0}
    start = time.perf_counter()
    async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or []
                if choices:
                    now = time.perf_counter()
                    run.ttft.append(now - start)
                    await r.aclose()
                    return now
    run.errors += 1
    return time.perf_counter()


async def drive(url: str, args: argparse.Namespace, prompts: list[str]) -> dict[str, float]:
    run = Run()
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=args.streams + len(prompts) + 4,
                          max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as http:
        r = await http.post(f"{url}/v1/completions", json={
            "model": "bench", "prompt": "warm up", "max_tokens": 4})
        r.raise_for_status()
        streams = [asyncio.create_task(_stream(http, url, i, args.stream_tokens, run, stop))
                   for i in range(args.streams)]
        while len(run.first) < args.streams:
            await asyncio.sleep(0.1)
        await asyncio.sleep(2)  # every stream past its prompt
        idle_start = time.perf_counter()
        await asyncio.sleep(args.idle)
        load_start = time.perf_counter()

        async def arrive(k: int, prompt: str) -> float:
            await asyncio.sleep(k * args.interval)
            return await _long(http, url, prompt, run)

        ends = await asyncio.gather(*(arrive(k, p) for k, p in enumerate(prompts)))
        measured = await _budget(http, url)
        stop.set()
        await asyncio.gather(*streams)
    idle, load = run.itl(idle_start, load_start), run.itl(load_start, max(ends))

    def pct(xs: list[float], q: int) -> float:
        return round(1000 * statistics.quantiles(xs, n=100)[q - 1], 1) if len(xs) > 1 else 0.0

    return {"idle p50": pct(idle, 50), "idle p99": pct(idle, 99),
            "load p50": pct(load, 50), "load p99": pct(load, 99),
            "ttft s": round(statistics.mean(run.ttft), 1) if run.ttft else 0.0,
            "ttft max s": round(max(run.ttft), 1) if run.ttft else 0.0,
            "load s": round(max(ends) - load_start, 1), "tokens idle": len(idle),
            "tokens load": len(load), "errors": run.errors, **measured}


_GAUGES = {"llamaserve_decode_step_seconds": "decode step ms",
           "llamaserve_prefill_token_seconds": "prefill ms/token",
           "llamaserve_prefill_budget_tokens": "budget tokens"}


async def _budget(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """llamaserve's measured step costs at the end of the load (its /metrics gauges)."""
    r = await http.get(f"{url}/metrics")
    out: dict[str, float] = {}
    if r.status_code != 200:
        return out
    for line in r.text.splitlines():
        name, _, value = line.partition(" ")
        if name in _GAUGES:
            scale = 1 if name.endswith("tokens") else 1000
            out[_GAUGES[name]] = round(float(value) * scale, 1)
    return out


def start_llamaserve(args: argparse.Namespace, target: float, port: int,
                     tmp: Path) -> subprocess.Popen[bytes]:
    cfg = {"server": {"log_level": "warning"},
           "model": {"path": args.model, "alias": "bench", "n_ctx": args.n_ctx,
                     "n_seq_max": args.n_seq, "n_batch": 512, "n_ubatch": 512,
                     "threads": args.threads, "threads_batch": args.threads,
                     "kv_unified": True, "prefill_step_target": target}}
    path = tmp / f"fairness-{target}.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def start_llama_server(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [args.llama_server, "-m", args.model, "--port", str(port), "-np", str(args.n_seq),
         "-cb", "-c", str(args.n_ctx), "-t", str(args.threads), "-tb", str(args.threads),
         "-b", "512", "-ub", "512", "--kv-unified", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--model", default=str(model_path("qwen-0.5b")))
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--stream-tokens", type=int, default=256)
    ap.add_argument("--long-tokens", type=int, default=4000)
    ap.add_argument("--long-count", type=int, default=2)
    ap.add_argument("--interval", type=float, default=20.0,
                    help="seconds between long prompts")
    ap.add_argument("--idle", type=float, default=15.0)
    ap.add_argument("--targets", default="2", help="llamaserve prefill_step_target values")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-seq", type=int, default=10)
    ap.add_argument("--n-ctx", type=int, default=16384)
    args = ap.parse_args()
    from llama_cpp import Llama

    vocab = Llama(args.model, vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False))

    prompts = [long_prompt(count, args.long_tokens, seed) for seed in range(args.long_count)]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        servers: list[tuple[str, Callable[[int], subprocess.Popen[bytes]]]] = [
            (f"llamaserve (target {t:g})" if t else "llamaserve (fixed 512)",
             functools.partial(start_llamaserve, args, t, tmp=Path(tmp)))
            for t in (float(x) for x in args.targets.split(","))]
        if args.llama_server:
            servers.append(("llama-server", lambda port: start_llama_server(args, port)))
        for name, start in servers:
            port = _port()
            proc = start(port)
            try:
                _wait(f"http://127.0.0.1:{port}/health", proc)
                results[name] = asyncio.run(drive(f"http://127.0.0.1:{port}", args, prompts))
                print(f"{name}: {results[name]}", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(30)
    ref = results.get("llama-server")
    rows: list[dict[str, object]] = []
    for name, res in results.items():
        row: dict[str, object] = {"server": name, **res}
        row["load p99 / idle p99"] = round(res["load p99"] / max(res["idle p99"], 1e-9), 2)
        if ref is not None and name != "llama-server":
            row["load p99 / llama-server"] = round(res["load p99"] / max(ref["load p99"], 1e-9), 3)
            row["ttft / llama-server"] = round(res["ttft s"] / max(ref["ttft s"], 1e-9), 3)
        rows.append(row)
    report(rows, "fairness", Chart("server", ["idle p99", "load p99"], "ms",
                                   "Stream ITL p99 while 4,000-token prompts arrive", log=True))


if __name__ == "__main__":
    main()
