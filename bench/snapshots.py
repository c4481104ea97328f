"""Time to first token on a hybrid (recurrent + attention) model when a prompt shares only
part of a cached sequence: recurrent-state snapshots (llamaserve) vs context checkpoints
(llama.cpp's llama-server), on the same GGUF.

Per server, one fresh start, then in order:

  cold           a ~2,000-token system prompt and a question (nothing cached)
  second conv.   the same system prompt, another question
  next turn      the first conversation, its answer and a new question (an agent's turn)
  retried turn   the same history, the last question edited
  same again     the retried prompt once more

Prints a table (TTFT ms, cached tokens where the server reports them) and, for llamaserve,
the snapshot memory from /metrics. Default model: the tiny Qwen3.5-architecture file of
``tests/make_hybrid_model.py`` (random weights: the timings, not the text, matter).
``--gemma``: Gemma 3 270M, a sliding-window model, at ``swa_full: false`` (its window layers
keep the last 512 positions; both servers get the chat template of
``configs/gemma3-270m.json``, llama-server its default context checkpoints).

    flock /tmp/llamaserve-bench.lock python bench/snapshots.py \\
        [--llama-server /tmp/llama-build/bin/llama-server] [--model X.gguf | --gemma]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from make_hybrid_model import default_path, write_hybrid_model  # noqa: E402

from compare_servers import _port, _wait  # noqa: E402
from prefix_cache import system_prompt  # noqa: E402
from report import Chart, report  # noqa: E402

PHASES = ["cold", "second conv.", "next turn", "retried turn", "same again"]


def ask(url: str, messages: list[dict[str, str]]) -> tuple[float, str, int | None]:
    """(seconds to the first streamed token, the answer, cached prompt tokens if reported)."""
    body = {"model": "bench", "stream": True, "max_tokens": 12, "temperature": 0,
            "stream_options": {"include_usage": True}, "messages": messages}
    start = time.perf_counter()
    first, text, cached = 0.0, [], None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk: dict[str, Any] = json.loads(line[6:])
            for c in chunk.get("choices") or []:
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter() - start
                    text.append(piece)
            usage = chunk.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            if "cached_tokens" in details:
                cached = int(details["cached_tokens"])
            timings = chunk.get("timings") or {}
            if cached is None and "cache_n" in timings:
                cached = int(timings["cache_n"])
    return first or time.perf_counter() - start, "".join(text), cached


def scenario(url: str, system: str, notes: str = "") -> dict[str, tuple[float, int | None]]:
    """``notes``: text the first question carries (then the second conversation branches
    that far back from the end of the first, past a sliding window)."""
    def conv(*turns: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": system},
                *({"role": "user" if i % 2 == 0 else "assistant", "content": t}
                  for i, t in enumerate(turns))]

    out: dict[str, tuple[float, int | None]] = {}
    q1 = "Which rules mention rivers?" + (f"\n\nMy notes:\n{notes}" if notes else "")
    t, answer, c = ask(url, conv(q1))
    out["cold"] = (t, c)
    t, _, c = ask(url, conv("Which rules mention violins?"))
    out["second conv."] = (t, c)
    t, _, c = ask(url, conv(q1, answer or "None.", "And tea?"))
    out["next turn"] = (t, c)
    retried = conv(q1, answer or "None.", "And comets?")
    t, _, c = ask(url, retried)
    out["retried turn"] = (t, c)
    t, _, c = ask(url, retried)
    out["same again"] = (t, c)
    return out


def snapshot_bytes(url: str) -> float | None:
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("llamaserve_state_snapshot_bytes"):
            return float(line.split()[-1])
    return None


def start_llamaserve(model: str, threads: int, port: int, tmp: Path,
                     template: str | None = None) -> subprocess.Popen[bytes]:
    cfg: dict[str, Any] = {
        "server": {"log_level": "warning"},
        "model": {"path": model, "alias": "bench", "n_ctx": 8192, "n_seq_max": 4,
                  "n_batch": 512, "n_ubatch": 512, "threads": threads,
                  "threads_batch": threads, "kv_unified": True, "swa_full": False}}
    if template is not None:
        cfg["model"]["chat_template"] = template
    path = tmp / "snapshots-bench.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def start_llama_server(binary: str, model: str, threads: int, port: int,
                       template: Path | None = None) -> subprocess.Popen[bytes]:
    extra = [] if template is None else ["--chat-template-file", str(template)]
    return subprocess.Popen([binary, "-m", model, "--port", str(port), "-np", "4", "-c", "8192",
                             "-t", str(threads), "-tb", str(threads), "-b", "512", "-ub", "512",
                             "--kv-unified", "--no-webui", "--jinja", *extra],
                            stdout=subprocess.DEVNULL, stderr=open(os.devnull if not os.environ.get(
                                "BENCH_LOG") else os.environ["BENCH_LOG"], "wb"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--model", default="")
    ap.add_argument("--gemma", action="store_true",
                    help="Gemma 3 270M (sliding window, swa_full: false) from the model cache")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--words", type=int, default=1450, help="system prompt size (~2,000 tokens)")
    args = ap.parse_args()
    model = args.model
    template: str | None = None
    if args.gemma:
        from fetch_models import model_path
        model = str(model_path("gemma"))
        gemma = json.loads((ROOT / "configs" / "gemma3-270m.json").read_text())["model"]
        template = "".join(gemma["chat_template"])
    if not model:
        path = default_path()
        if not path.exists():
            write_hybrid_model(path)
        model = str(path)
    system = system_prompt(args.words, "depot")
    # Gemma: the first question carries ~2,400 tokens of notes, so the second conversation
    # branches that far back: past what the window layers' cells (512 x 4 sequences + 512)
    # still hold, which only a snapshot does
    notes = system_prompt(1750, "notes") if args.gemma else ""
    results: dict[str, dict[str, tuple[float, int | None]]] = {}
    mem: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        template_file = None
        if template is not None:
            template_file = Path(tmp) / "template.jinja"
            template_file.write_text(template)
        servers: list[tuple[str, Callable[[int], subprocess.Popen[bytes]]]] = [
            ("llamaserve", lambda port: start_llamaserve(model, args.threads, port, Path(tmp),
                                                         template))]
        if args.llama_server:
            servers.append(("llama-server", lambda port: start_llama_server(
                args.llama_server, model, args.threads, port, template_file)))
        for name, start in servers:
            port = _port()
            proc = start(port)
            url = f"http://127.0.0.1:{port}"
            try:
                _wait(f"{url}/health", proc)
                ask(url, [{"role": "user", "content": "Say hi."}])  # warm-up
                results[name] = scenario(url, system, notes)
                if name == "llamaserve":
                    mem = snapshot_bytes(url)
            finally:
                proc.terminate()
                proc.wait(60)
            print(f"{name}: {results[name]}", file=sys.stderr)
    rows: list[dict[str, object]] = []
    for phase in PHASES:
        row: dict[str, object] = {"phase": phase}
        for name, got in results.items():
            t, cached = got[phase]
            row[f"{name} ms"] = round(t * 1000, 1)
            row[f"{name} cached"] = "" if cached is None else cached
        rows.append(row)
    print(f"llamaserve snapshot memory: {'?' if mem is None else round(mem / 2**20, 3)} MiB",
          file=sys.stderr)
    for row in rows:
        row["llamaserve snapshot MiB"] = "" if mem is None else round(mem / 2**20, 3)
    name = "snapshots-gemma" if args.gemma else "snapshots"
    report(rows, name, Chart("phase", [f"{n} ms" for n in results],
                                    "time to first token (ms)",
                                    ("Gemma 3 270M (swa_full: false)" if args.gemma else
                                     "Hybrid model") + ": prompts sharing part of a cached "
                                    "sequence"))

if __name__ == "__main__":
    main()
