"""The Batch API at the sizes of issue 31, through the OpenAI SDK on real models:

1. a 1,000-line chat batch on Qwen2.5-Coder-0.5B-Instruct (greedy, ``--tokens`` tokens a
   line, 8 sequences): every line answered once, and ``--check`` lines picked at random
   equal to the same request sent interactively afterwards;
2. a 10,000-input embeddings batch on all-MiniLM-L6-v2 (1,000 lines of 10 inputs): every
   vector there, ``--check`` lines equal to interactive vectors to float noise (2e-4).

Too long for the test suite (which runs 200 chat lines and 1,200 inputs); prints a table
and writes bench/results/batch_scale.json.

    python bench/batch_scale.py
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import ServerProcess, minilm_config, qwen_config, start_server  # noqa: E402
from report import report  # noqa: E402

WORDS = ["river", "stone", "lamp", "garden", "window", "paper", "silver", "forest", "cloud",
         "bridge", "engine", "harbor", "violin", "orchard", "glacier", "market"]


def jsonl(url: str, bodies: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url,
                                "body": b}).encode() + b"\n" for i, b in enumerate(bodies))


def run_batch(client: OpenAI, url: str, bodies: list[dict[str, Any]]
              ) -> tuple[dict[str, dict[str, Any]], float, Any]:
    """Submit, wait (polling every second, as a client would), read the output file."""
    started = time.perf_counter()
    f = client.files.create(file=("input.jsonl", jsonl(url, bodies)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=url,  # type: ignore[arg-type]
                                  completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(1.0)
        batch = client.batches.retrieve(batch.id)
    elapsed = time.perf_counter() - started
    out = [json.loads(x) for x in client.files.content(batch.output_file_id or "").text
           .splitlines()] if batch.output_file_id else []
    by_id = {x["custom_id"]: x for x in out}
    assert len(by_id) == len(out), "a custom_id answered twice"
    return by_id, elapsed, batch


def server(cfg: dict[str, Any], tmp: Path) -> ServerProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg["server"] = {**cfg.get("server", {}), "batch_dir": str(tmp / "batches"),
                     "batch_max_lines": 50_000, "batch_file_max_bytes": 200 * 1024 * 1024}
    return start_server(cfg, tmp)


def chat(tmp: Path, n: int, tokens: int, check: int, rng: random.Random) -> dict[str, Any]:
    s = server(qwen_config(n_seq_max=8), tmp)
    try:
        client = OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)
        model = "qwen2.5-coder-0.5b-instruct"
        bodies = [{"model": model, "temperature": 0, "max_tokens": tokens, "messages": [
            {"role": "user", "content": f"Name a use of a {rng.choice(WORDS)} and a "
                                        f"{rng.choice(WORDS)} (case {i})."}]}
                  for i in range(n)]
        out, elapsed, batch = run_batch(client, "/v1/chat/completions", bodies)
        answered = sum(1 for i in range(n) if out.get(f"req-{i}", {}).get(
            "response", {}).get("status_code") == 200)
        same = 0
        picked = rng.sample(range(n), check)
        for i in picked:
            alone = client.chat.completions.create(**bodies[i])
            got = out[f"req-{i}"]["response"]["body"]
            same += got["choices"][0]["message"]["content"] == alone.choices[0].message.content
        return {"batch": f"{n} chat lines x {tokens} tokens", "model": model,
                "status": batch.status, "answered once": answered, "seconds": round(elapsed, 1),
                "lines/s": round(n / elapsed, 2), "checked": check,
                "equal to interactive": same}
    finally:
        s.stop()


def embeddings(tmp: Path, n_lines: int, per_line: int, check: int, rng: random.Random
               ) -> dict[str, Any]:
    s = server(minilm_config(), tmp)
    try:
        client = OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)
        bodies: list[dict[str, Any]] = [
            {"model": "x", "input": [f"{rng.choice(WORDS)} {rng.choice(WORDS)} number "
                                     f"{i * per_line + j}" for j in range(per_line)]}
            for i in range(n_lines)]
        out, elapsed, batch = run_batch(client, "/v1/embeddings", bodies)
        vectors = sum(len(x["response"]["body"]["data"]) for x in out.values()
                      if x["response"]["status_code"] == 200)
        same = 0
        for i in rng.sample(range(n_lines), check):
            ref = client.embeddings.create(model="x", input=bodies[i]["input"])
            a = np.array([d["embedding"] for d in out[f"req-{i}"]["response"]["body"]["data"]])
            b = np.array([d.embedding for d in ref.data])
            same += bool(np.allclose(a, b, atol=2e-4))
        return {"batch": f"{n_lines * per_line} embedding inputs ({n_lines} lines)",
                "model": "all-MiniLM-L6-v2", "status": batch.status,
                "answered once": vectors, "seconds": round(elapsed, 1),
                "lines/s": round(n_lines / elapsed, 2), "checked": check,
                "equal to interactive": same}
    finally:
        s.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chat-lines", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--embedding-lines", type=int, default=1000)
    ap.add_argument("--inputs-per-line", type=int, default=10)
    ap.add_argument("--check", type=int, default=40)
    args = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [chat(Path(tmp) / "chat", args.chat_lines, args.tokens, args.check, rng),
                embeddings(Path(tmp) / "embed", args.embedding_lines, args.inputs_per_line,
                           args.check, rng)]
    report(rows, "batch_scale")


if __name__ == "__main__":
    main()
