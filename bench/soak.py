"""Soak: 64 concurrent clients for 5 minutes on Gemma 3 270M.

Each client loops over a mix: streamed completions and chats (30% of streams are
dropped after a few chunks), non-streamed requests, embeddings-free invalid requests
(bad JSON, wrong types, unknown routes). At the end the server must have answered
no 5xx, every sequence must be free again (``/metrics``), and its resident memory
must have grown less than 5% between minute 1 and the end.

    python bench/soak.py --minutes 5 --clients 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import gemma_config, start_server  # noqa: E402

INVALID = [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", json.dumps({"prompt": 5, "max_tokens": "x"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "x", "content": "a"}]}).encode()),
    ("/v1/responses", json.dumps({"input": 42}).encode()),
    ("/v1/nope", b"{}"),
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def client(http: httpx.AsyncClient, rng: random.Random, stop: float,
                 statuses: Counter[int], events: Counter[str]) -> None:
    while time.monotonic() < stop:
        kind = rng.random()
        try:
            if kind < 0.55:  # streamed, sometimes dropped mid-way
                chat = rng.random() < 0.5
                path = "/v1/chat/completions" if chat else "/v1/completions"
                body = ({"messages": [{"role": "user", "content": f"Tell me about {rng.random()}"}]}
                        if chat else {"prompt": f"Story {rng.random()}:"})
                body.update(stream=True, max_tokens=rng.randint(8, 48),
                            temperature=rng.choice([0, 0.8]))
                drop = rng.random() < 0.3
                async with http.stream("POST", path, json=body) as r:
                    statuses[r.status_code] += 1
                    chunks = 0
                    async for _ in r.aiter_lines():
                        chunks += 1
                        if drop and chunks >= 3:
                            events["dropped"] += 1
                            break
            elif kind < 0.8:  # plain requests
                r = await http.post("/v1/completions", json={
                    "prompt": f"Q{rng.random()}: the answer is", "max_tokens": rng.randint(1, 24),
                    "n": rng.choice([1, 1, 2])})
                statuses[r.status_code] += 1
            else:  # invalid
                path, raw = rng.choice(INVALID)
                r = await http.post(path, content=raw, headers={"content-type": "application/json"})
                statuses[r.status_code] += 1
        except httpx.HTTPError as exc:
            events[f"transport:{type(exc).__name__}"] += 1


async def soak(url: str, pid: int, minutes: float, clients: int) -> dict[str, object]:
    statuses: Counter[int] = Counter()
    events: Counter[str] = Counter()
    start = time.monotonic()
    stop = start + minutes * 60
    samples: list[tuple[float, int]] = []

    async def sample() -> None:
        while time.monotonic() < stop:
            samples.append((time.monotonic() - start, rss_kib(pid)))
            await asyncio.sleep(5)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        rngs = [random.Random(i) for i in range(clients)]
        await asyncio.gather(sample(), *(client(http, rngs[i], stop, statuses, events)
                                         for i in range(clients)))
    minute1 = next((kib for t, kib in samples if t >= 60), samples[0][1])
    final = samples[-1][1]
    return {"statuses": dict(sorted(statuses.items())), "events": dict(events),
            "rss_minute1_mib": round(minute1 / 1024, 1), "rss_end_mib": round(final / 1024, 1),
            "rss_growth_pct": round(100 * (final - minute1) / minute1, 2),
            "requests": sum(statuses.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--clients", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = gemma_config(n_seq_max=16, max_output_tokens=64)
        cfg["server"] = {"log_level": "warning", "max_queue": 256}
        server = start_server(cfg, Path(tmp))
        try:
            report = asyncio.run(soak(server.url, server.proc.pid, args.minutes, args.clients))
            time.sleep(2)
            m = server.metrics()
            report["running_after"] = m["llamaserve_requests_running"]
            report["waiting_after"] = m["llamaserve_requests_waiting"]
            report["sequences_in_use_after"] = m["llamaserve_sequences_in_use"]
            report["cancelled"] = m.get("llamaserve_sequences_finished_total{reason=cancelled}")
            report["healthy"] = httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        finally:
            server.stop()
    print(json.dumps(report, indent=2))
    five_xx = sum(n for s, n in report["statuses"].items() if s >= 500)  # type: ignore[attr-defined]
    ok = (five_xx == 0 and report["running_after"] == 0 and report["waiting_after"] == 0
          and report["healthy"] and float(report["rss_growth_pct"]) < 5)  # type: ignore[arg-type]
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
