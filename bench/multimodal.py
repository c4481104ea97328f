"""What images and LoRA adapters cost the other requests (Qwen2.5-Coder-0.5B, CPU).

1. Inter-token latency of --streams text streams while image requests arrive (one client
   sending distinct images back to back), next to the same streams with no image traffic,
   in alternating rounds, on two servers side by side: the default (a step may evaluate
   up to n_batch prompt tokens, an image's 196 positions at once) and
   ``model.prefill_chunk`` = --chunk (prompt tokens per step while others generate).
   The projector is a random-weight ViT written by tests/make_test_models.py at a
   realistic size (224 px, 16 px patches = 196 image tokens, width 768, 6 layers): its
   encoder costs what such a ViT costs; what it "sees" is noise.
2. LoRA mixing: the same streams all on the base model, all under one adapter, half and
   half (steps take turns between the two sets), and split over two adapters.

    flock /tmp/llamaserve-bench.lock python bench/multimodal.py

Prints the tables, writes bench/results/multimodal_itl.json and multimodal_lora.json.
"""

from __future__ import annotations

import argparse
import base64
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

from make_test_models import (  # noqa: E402
    ProjectorSpec,
    read_base_model,
    write_lora_adapter,
    write_projector,
)
from test_multimodal_server import png  # noqa: E402

from conftest import ServerProcess, qwen_config, require_model, start_server  # noqa: E402
from report import Chart, report  # noqa: E402

IMAGES: list[str] = []  # distinct base64 PNGs (every image request is a cache miss)
VIT = ProjectorSpec(image_size=224, patch_size=16, n_embd=768, n_head=12, n_ff=3072,
                    n_layer=6, mm_hidden=1024)


def stream(url: str, body: dict[str, Any], gaps: list[float]) -> int:
    """One streamed chat completion; appends the gaps between content chunks."""
    last, n = None, 0
    with httpx.stream("POST", url, json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if '"content"' not in line:
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last, n = now, n + 1
    return n


def text_body(i: int, tokens: int, lora: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "qwen", "stream": True, "temperature": 0, "max_tokens": tokens,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": f"Tell a long story about ship {i}."}]}
    if lora is not None:
        body["lora"] = lora
    return body


def run_streams(server: ServerProcess, bodies: list[dict[str, Any]],
                images: bool) -> dict[str, Any]:
    url = f"{server.base_url}/chat/completions"
    gaps: list[list[float]] = [[] for _ in bodies]
    counts = [0] * len(bodies)
    done = threading.Event()
    sent_images = [0]

    def image_client() -> None:
        while not done.is_set():
            data = IMAGES.pop()  # made before the runs: no client work competes for the CPU
            httpx.post(url, timeout=600, json={
                "model": "qwen", "max_tokens": 1, "temperature": 0, "messages": [{
                    "role": "user", "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,"
                                                                   f"{data}"}}]}]})
            sent_images[0] += 1

    def one(i: int) -> None:
        counts[i] = stream(url, bodies[i], gaps[i])

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    feeder = threading.Thread(target=image_client) if images else None
    if feeder is not None:
        feeder.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    done.set()
    if feeder is not None:
        feeder.join()
    flat = sorted(g for gs in gaps for g in gs)

    def pct(p: float) -> float:
        return flat[min(len(flat) - 1, int(p * len(flat)))] * 1000 if flat else 0.0
    return {"tok_s": sum(counts) / elapsed, "p50": pct(0.5), "p95": pct(0.95),
            "p99": pct(0.99), "max": flat[-1] * 1000 if flat else 0.0,
            "images": sent_images[0]}


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of each figure over the rounds."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=32, help="prefill_chunk of the second server")
    args = ap.parse_args()
    qwen = require_model("qwen-0.5b")
    base = read_base_model(qwen)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        print("writing the test ViT projector and adapters …", file=sys.stderr)
        IMAGES.extend(base64.b64encode(png(seed, 224, 224)).decode() for seed in range(400))
        mmproj = write_projector(tmp / "vit.gguf", base.n_embd, spec=VIT)
        loras = [write_lora_adapter(tmp / f"adapter-{c}.gguf", base, seed=i + 1, b_scale=0.03)
                 for i, c in enumerate("ab")]
        cfg = qwen_config(n_seq_max=args.streams + 2, n_ctx=4096 * 4, threads=args.threads,
                          mtmd={"mmproj_path": str(mmproj), "memory_cache_bytes": 0},
                          loras=[{"path": str(p), "scale": 0.0} for p in loras])
        chunked = {**cfg, "model": {**cfg["model"], "prefill_chunk": args.chunk}}
        servers = {"default": start_server(cfg, tmp),
                   f"prefill_chunk {args.chunk}": start_server(chunked, tmp)}
        server = servers["default"]
        try:
            for s in servers.values():
                run_streams(s, [text_body(0, 8)], images=True)  # warm-up: first encode
            bodies = [text_body(i, args.tokens) for i in range(args.streams)]
            runs: dict[tuple[str, bool], list[dict[str, Any]]] = {
                (name, images): [] for name in servers for images in (False, True)}
            for _ in range(args.rounds):
                for name, s in servers.items():
                    for images in (False, True):
                        runs[(name, images)].append(run_streams(s, bodies, images))
            metrics = server.metrics()
            encode_s = metrics["llamaserve_media_encode_seconds_sum"] / max(
                1, metrics["llamaserve_media_encode_seconds_count"])
            print(f"image: 196 tokens; projector encode {encode_s * 1000:.0f} ms on average",
                  file=sys.stderr)
            rows = []
            for name in servers:
                p = best(runs[(name, False)])
                for images in (False, True):
                    r = best(runs[(name, images)])
                    rows.append({"server": name,
                                 "traffic": "+ images" if images else "text only",
                                 "streams": args.streams, "tok/s": round(r["tok_s"], 1),
                                 "ITL p50 ms": round(r["p50"], 1),
                                 "ITL p95 ms": round(r["p95"], 1),
                                 "ITL p99 ms": round(r["p99"], 1),
                                 "ITL max ms": round(r["max"], 1), "images": int(r["images"]),
                                 "p50 ratio": round(r["p50"] / p["p50"], 2),
                                 "p95 ratio": round(r["p95"] / p["p95"], 2),
                                 "encode ms": round(encode_s * 1000)})
            for row in rows:
                row["case"] = f"{row['server']}, {row['traffic']}"
            report(rows, "multimodal_itl", Chart("case", ["ITL p50 ms", "ITL p95 ms",
                                                          "ITL p99 ms"], "ms"))

            half = args.streams // 2
            a = [{"name": "adapter-a", "scale": 1.0}]
            b = [{"name": "adapter-b", "scale": 1.0}]
            scenarios = {
                "all base": [text_body(i, args.tokens, []) for i in range(args.streams)],
                "all adapter a": [text_body(i, args.tokens, a) for i in range(args.streams)],
                "half base, half a": [text_body(i, args.tokens, [] if i < half else a)
                                      for i in range(args.streams)],
                "half a, half b": [text_body(i, args.tokens, a if i < half else b)
                                   for i in range(args.streams)]}
            results: dict[str, list[dict[str, Any]]] = {k: [] for k in scenarios}
            for _ in range(args.rounds):
                for name, bodies in scenarios.items():
                    results[name].append(run_streams(server, bodies, images=False))
            ref = best(results["all base"])
            lora_rows = []
            for name in scenarios:
                r = best(results[name])
                lora_rows.append({"scenario": name, "streams": args.streams,
                                  "tok/s": round(r["tok_s"], 1),
                                  "ITL p50 ms": round(r["p50"], 1),
                                  "ITL p95 ms": round(r["p95"], 1),
                                  "tok/s ratio": round(r["tok_s"] / ref["tok_s"], 2)})
            report(lora_rows, "multimodal_lora", Chart("scenario", ["tok/s"], "tokens/s"))
        finally:
            for s in servers.values():
                s.stop()


if __name__ == "__main__":
    main()
