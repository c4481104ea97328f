"""Reranking against llama-server on the same GGUF: are the scores equal, and how many
documents a second does each server rerank at 1 and 8 concurrent requests?

Both kinds of generated reranker (tests/make_reranker_models.py, ``--size bench``: random
weights, so the order is noise and only the numbers and the speed count):

  bert    a cross-encoder the shape of ms-marco-MiniLM-L-6 (384 wide, 6 blocks) with a
          dense + tanh + logit head, rank pooling, MiniLM's real WordPiece vocabulary
  qwen3   a Qwen3-Reranker-style LLM (256 wide, 4 blocks, Qwen's real 152k vocabulary),
          scored from the last token of the GGUF's rerank template (P(yes))

llamaserve and llama-server (``--rerank``) run side by side on the same file with the same
sizes (16 sequences, a unified KV cache, 2048-token batches, the same threads). First the
scores: a document sent alone is one sequence in one batch on both servers, so its score
must be the same number (``--tolerance``, relative); in whole requests the servers group
documents into micro-batches differently, and llama.cpp's numerics depend on what shares a
micro-batch (llama-server's own score for a document batched and alone differ by up to
1e-3 relative on the BERT file), so there the difference must stay within twice
llama-server's own spread. Then documents reranked per second, one request at a time and 8
in flight, each request a query and 32 (bert) or 16 (qwen3) passages of 40-70 words; the
servers are timed in turn, alternating, best of ``--rounds`` (the machine may be shared).
Prints the table and writes bench/results/rerank.json; the ratio is llamaserve /
llama-server.

    python bench/rerank.py --llama-server /tmp/llama-build/bin/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from make_reranker_models import write_reranker  # noqa: E402

from compare_servers import _port, _wait  # noqa: E402
from report import report  # noqa: E402

WORDS = ["river", "city", "bridge", "train", "winter", "budget", "parser", "library", "storm",
         "valley", "fence", "morning", "committee", "archive", "harbour", "signal", "garden",
         "engine", "ledger", "market", "island", "tower", "forest", "museum", "capital",
         "language", "protein", "planet", "ocean", "desert"]
DOCS = {"bert": 32, "qwen3": 16}  # passages per request (the qwen3 file is slower per token:
# llama.cpp computes its 152k-token LM head for every prompt token, though only the last
# token's yes/no rows are read)
N_SEQ, N_BATCH, N_CTX = 16, 2048, 8192


def passages(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 70))) + "."
            for _ in range(n)]


def requests(kind: str, n: int, docs: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"model": "bench", "query": f"Which {rng.choice(WORDS)} is near the "
             f"{rng.choice(WORDS)}?", "documents": passages(rng, docs)} for _ in range(n)]


def start_llamaserve(model: str, threads: int, fa: str, port: int, tmp: Path
                     ) -> subprocess.Popen[bytes]:
    cfg = {"server": {"log_level": "warning"},
           "model": {"path": model, "alias": "bench", "n_ctx": N_CTX, "n_seq_max": N_SEQ,
                     "n_batch": N_BATCH, "n_ubatch": N_BATCH, "threads": threads,
                     "threads_batch": threads,
                     "flash_attn": {"auto": "auto", "on": True, "off": False}[fa]}}
    path = tmp / f"rerank-{port}.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def start_llama_server(binary: str, model: str, threads: int, fa: str, port: int
                       ) -> subprocess.Popen[bytes]:
    return subprocess.Popen([binary, "-m", model, "--port", str(port), "--rerank", "-fa", fa,
                             "-np", str(N_SEQ), "-kvu", "-c", str(N_CTX), "-b", str(N_BATCH),
                             "-ub", str(N_BATCH), "-t", str(threads), "-tb", str(threads),
                             "--no-webui"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def scores(url: str, body: dict[str, Any]) -> dict[int, float]:
    r = httpx.post(f"{url}/v1/rerank", json=body, timeout=600)
    r.raise_for_status()
    return {x["index"]: x["relevance_score"] for x in r.json()["results"]}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(1.0, abs(b))


def compare(urls: dict[str, str], bodies: list[dict[str, Any]], n_alone: int
            ) -> dict[str, float]:
    """Largest relative differences: each document alone (one sequence in the batch, so
    both servers compute exactly the same thing), whole requests (llama.cpp's numerics
    depend on which sequences share a micro-batch, and the servers batch differently), and
    llama-server's own spread between a document batched and alone."""
    out = {"alone": 0.0, "batched": 0.0, "llama-server batched vs alone": 0.0, "n": 0}
    for body in bodies:
        ours, theirs = scores(urls["llamaserve"], body), scores(urls["llama-server"], body)
        assert ours.keys() == theirs.keys() == set(range(len(body["documents"])))
        for i in range(len(body["documents"])):
            out["batched"] = max(out["batched"], _rel(ours[i], theirs[i]))
            out["n"] += 1
        for i, doc in enumerate(body["documents"][:n_alone]):
            one = {**body, "documents": [doc]}
            alone_ours, alone_theirs = scores(urls["llamaserve"], one)[0], \
                scores(urls["llama-server"], one)[0]
            out["alone"] = max(out["alone"], _rel(alone_ours, alone_theirs))
            out["llama-server batched vs alone"] = max(out["llama-server batched vs alone"],
                                                       _rel(theirs[i], alone_theirs))
    return out


async def docs_per_second(url: str, bodies: list[dict[str, Any]], concurrency: int) -> float:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        async def one(body: dict[str, Any]) -> None:
            async with sem:
                r = await http.post(f"{url}/v1/rerank", json=body)
                r.raise_for_status()
                assert len(r.json()["results"]) == len(body["documents"])

        await one(bodies[0])  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return sum(len(b["documents"]) for b in bodies) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""),
                    required=not os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--kinds", default="bert,qwen3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=8, help="requests per timing at 1 in "
                    "flight (twice as many at 8)")
    ap.add_argument("--tolerance", type=float, default=1e-5,
                    help="largest relative difference of a document scored alone")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            model = str(write_reranker(kind, "bench"))
            ports = {"llamaserve": _port(), "llama-server": _port()}
            fa = args.flash_attn
            procs = {"llamaserve": start_llamaserve(model, args.threads, fa,
                                                    ports["llamaserve"], Path(tmp)),
                     "llama-server": start_llama_server(args.llama_server, model, args.threads,
                                                        fa, ports["llama-server"])}
            urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
            try:
                for name, proc in procs.items():
                    _wait(f"{urls[name]}/health", proc)
                diff = compare(urls, requests(kind, 4, DOCS[kind], seed=1), n_alone=8)
                ok = diff["alone"] <= args.tolerance and diff["batched"] <= max(
                    args.tolerance, 2 * diff["llama-server batched vs alone"])
                print(f"{kind}: {diff}", file=sys.stderr)
                for conc in (1, 8):
                    n_req = args.requests * (2 if conc == 8 else 1)
                    bodies = requests(kind, n_req, DOCS[kind], seed=conc + 10)
                    rate = {name: 0.0 for name in urls}
                    for _ in range(args.rounds):
                        for name, url in urls.items():
                            rate[name] = max(rate[name],
                                             asyncio.run(docs_per_second(url, bodies, conc)))
                    print(f"{kind} x{conc}: {rate}", file=sys.stderr)
                    rows.append({"model": kind, "concurrent": conc,
                                 "docs/request": DOCS[kind], "scores equal": ok,
                                 "diff alone": float(f"{diff['alone']:.1e}"),
                                 "diff batched": float(f"{diff['batched']:.1e}"),
                                 "llama-server's own": float(
                                     f"{diff['llama-server batched vs alone']:.1e}"),
                                 "llamaserve docs/s": round(rate["llamaserve"], 1),
                                 "llama-server docs/s": round(rate["llama-server"], 1),
                                 "ratio": round(rate["llamaserve"] / rate["llama-server"], 2)})
            finally:
                for proc in procs.values():
                    proc.terminate()
                    proc.wait(30)
    report(rows, "rerank")
    if not all(r["scores equal"] for r in rows):
        sys.exit("scores differ from llama-server's")


if __name__ == "__main__":
    main()
