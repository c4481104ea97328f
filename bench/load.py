"""Streaming load generator for any OpenAI-compatible server.

Each of C clients streams /v1/completions requests of exactly N tokens
(``ignore_eos``) back to back; we report aggregate generated tokens/s, median
time to first token and median inter-token latency per concurrency level.

    python bench/load.py --url http://127.0.0.1:8000/v1 --concurrency 1,4,16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import httpx

from report import Chart, print_table, report

__all__ = ["Chart", "print_table", "report", "run_level"]


@dataclass
class LevelResult:
    concurrency: int
    requests: int = 0
    tokens: int = 0
    wall: float = 0.0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0

    def row(self) -> dict[str, float]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "tok_s": round(self.tok_s, 1),
            "ttft_ms": round(1000 * statistics.median(self.ttft), 1) if self.ttft else 0.0,
            "itl_ms": round(1000 * statistics.median(self.itl), 2) if self.itl else 0.0,
            "errors": self.errors,
        }


async def _one(http: httpx.AsyncClient, url: str, model: str, prompt: str, tokens: int,
               res: LevelResult) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "stream": True,
            "temperature": 0.8, "ignore_eos": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    last = None
    got = 0
    usage_tokens = None
    async with http.stream("POST", f"{url}/completions", json=body) as r:
        if r.status_code != 200:
            res.errors += 1
            await r.aread()
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage_tokens = chunk["usage"].get("completion_tokens")
            choices = chunk.get("choices") or []
            if not choices or not choices[0].get("text"):
                continue
            now = time.perf_counter()
            if last is None:
                res.ttft.append(now - start)
            else:
                res.itl.append(now - last)
            last = now
            got += 1
    res.requests += 1
    res.tokens += usage_tokens if usage_tokens else tokens


async def run_level(url: str, model: str, concurrency: int, tokens: int, rounds: int,
                    prompt_words: int = 8) -> LevelResult:
    res = LevelResult(concurrency)
    # no keep-alive: a server closing an idle connection must not race a new request
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        async def client(i: int) -> None:
            for k in range(rounds):
                prompt = f"Story {i}-{k}: " + " ".join(["once upon a time"] * (prompt_words // 4))
                try:
                    await _one(http, url, model, prompt, tokens, res)
                except httpx.HTTPError:
                    res.errors += 1

        # warm-up request (not counted)
        await _one(http, url, model, "warm up", 4, LevelResult(0))
        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(concurrency)))
        res.wall = time.perf_counter() - start
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default="model")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per client per level")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    for c in (int(x) for x in args.concurrency.split(",")):
        rows.append(dict(asyncio.run(run_level(args.url, args.model, c, args.tokens,
                                               args.rounds)).row()))
    report(rows, "load", Chart("concurrency", ["tok_s"], "tokens/s"))


if __name__ == "__main__":
    main()
