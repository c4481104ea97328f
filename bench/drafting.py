"""Draft decoding side by side: tokens/s end to end (prefill included), with and without.

  (a) code edit, prompt lookup: Qwen2.5-Coder-0.5B gets a 60-line function and returns it
      with one change (target ≥ 1.8×);
  (b) code generation, draft model: Qwen2.5-Coder-1.5B drafted by Qwen2.5-Coder-0.5B
      (target ≥ 1.3×);
  (c) prose, prompt lookup: a free-form story where drafts rarely hit (target ≥ 0.95×).

Each task runs as 1 stream and as 8 concurrent streams, greedy, without drafting and with
(two servers side by side, taking turns; best of ``--rounds``); the texts should be
identical. 2 threads.

    python bench/drafting.py [--tasks a,b,c]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from conftest import qwen_config, start_server  # noqa: E402
from edit_corpus import ORDERS_REPORT  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import report  # noqa: E402

FUNCTION = ORDERS_REPORT + '''    largest = None
    for row in report:
        if largest is None or row["total"] > largest["total"]:
            largest = row
    summary = {
        "customers": len(report),
        "skipped": skipped,
        "grand_total": round(sum(row["total"] for row in report), 2),
        "largest": largest["customer"] if largest else None,
    }
    if not report:
        summary["note"] = "no orders"
    return {
        "rows": report,
        "summary": summary,
    }
'''
RENAMES = [("skipped", "ignored"), ("totals", "sums"), ("counts", "tallies"),
           ("refunds", "returns"), ("report", "rows_out"), ("largest", "biggest"),
           ("average", "mean"), ("summary", "overview")]
ROUNDS = 2
TOPICS = ["a lighthouse keeper", "a lost violin", "a city of bridges", "a comet", "an orchard",
          "a quiet harbor", "a typewriter", "a glacier"]


def edit_prompt(i: int) -> list[dict[str, str]]:
    old, new = RENAMES[i % len(RENAMES)]
    return [{"role": "user", "content": (
        f"Here is a Python function:\n\n```python\n{FUNCTION}```\n\nRename the variable "
        f"`{old}` to `{new}` everywhere in it. Reply with the complete updated function in "
        "one code block and nothing else.")}]


def codegen_prompt(i: int) -> list[dict[str, str]]:
    tasks = ["a binary search tree with insert, delete and in-order traversal",
             "an LRU cache class with get and put", "a tokenizer for arithmetic expressions",
             "a function that merges overlapping intervals", "a min-heap class",
             "a CSV parser that handles quoted fields", "Dijkstra's shortest path algorithm",
             "a trie with insert, search and starts_with"]
    return [{"role": "user", "content": f"Write Python code for {tasks[i % len(tasks)]}, "
                                        "with docstrings and type hints."}]


def prose_prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a short, original story about "
                                        f"{TOPICS[i % len(TOPICS)]}. Use vivid, varied prose."}]


def run(url: str, prompts: list[list[dict[str, str]]], max_tokens: int) -> tuple[float, list[str],
                                                                                    int]:
    def one(messages: list[dict[str, str]]) -> tuple[str, int]:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=1200, json={
            "model": "x", "messages": messages, "temperature": 0, "max_tokens": max_tokens})
        r.raise_for_status()
        body = r.json()
        return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    elapsed = time.perf_counter() - start
    tokens = sum(n for _, n in results)
    return tokens / elapsed, [t for t, _ in results], tokens


def measure(configs: dict[str, dict[str, Any]], tmp: Path, prompt: Any, max_tokens: int
            ) -> dict[tuple[str, int], tuple[float, list[str], dict[str, float]]]:
    """Both servers run side by side and take turns (this machine's speed drifts over
    minutes: alternating keeps the drift out of the ratio); best round of each."""
    servers = {name: start_server(cfg, tmp) for name, cfg in configs.items()}
    out: dict[tuple[str, int], tuple[float, list[str], dict[str, float]]] = {}
    try:
        for server in servers.values():
            run(server.url, [prompt(99)], 8)  # warm-up
        for streams in (1, 8):
            for _ in range(ROUNDS):
                for name, server in servers.items():
                    before = server.metrics()
                    tps, texts, _ = run(server.url, [prompt(i) for i in range(streams)],
                                        max_tokens)
                    after = server.metrics()
                    stats = {k: after.get(k, 0) - before.get(k, 0) for k in (
                        "llamaserve_draft_tokens_proposed_total",
                        "llamaserve_draft_tokens_accepted_total")}
                    if (name, streams) not in out or tps > out[name, streams][0]:
                        out[name, streams] = (tps, texts, stats)
    finally:
        for server in servers.values():
            server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="a,b,c")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    global ROUNDS
    ROUNDS = args.rounds
    tasks = {
        "a": ("code edit, prompt lookup (0.5B)", {}, {"draft_model": "prompt-lookup-decoding"},
              edit_prompt, 900),
        "b": ("code gen, draft model (1.5B ← 0.5B)",
              {"path": str(model_path("qwen-1.5b")), "alias": "x"},
              {"path": str(model_path("qwen-1.5b")), "alias": "x", "draft_model": "draft-model",
               "draft_model_path": str(model_path("qwen-0.5b"))}, codegen_prompt, 256),
        "c": ("prose, prompt lookup (0.5B)", {}, {"draft_model": "prompt-lookup-decoding"},
              prose_prompt, 256),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.tasks.split(","):
            name, base, drafted, prompt, max_tokens = tasks[key]
            result = measure({
                "plain": qwen_config(n_seq_max=8, n_ctx=16384, **base),
                "drafted": qwen_config(n_seq_max=8, n_ctx=16384, **drafted)},
                Path(tmp), prompt, max_tokens)
            for streams in (1, 8):
                p, f = result["plain", streams], result["drafted", streams]
                proposed = f[2]["llamaserve_draft_tokens_proposed_total"]
                accepted = f[2]["llamaserve_draft_tokens_accepted_total"]
                rows.append({"task": name, "streams": streams, "plain tok/s": round(p[0], 1),
                             "drafted tok/s": round(f[0], 1), "speedup": round(f[0] / p[0], 2),
                             "accepted": f"{accepted:g}/{proposed:g}",
                             "identical": p[1] == f[1]})
                print(json.dumps(rows[-1]), file=sys.stderr)
    report(rows, "drafting")


if __name__ == "__main__":
    main()
