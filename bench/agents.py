"""Agent workload: many multi-turn sessions over a long shared system prompt, llamaserve
vs llama.cpp's llama-server (as shipped: its host-memory prompt cache, --cache-ram, is on by
default), one run, one table.

``--sessions`` concurrent sessions (default 16) x ``--turns`` turns (8) on
Qwen2.5-Coder-0.5B with ``--n-seq`` sequences (4: more sessions than sequences). Every
session shares a ~2,000-token system prompt with tool definitions; each turn appends the
model's previous answer and ~150-300 tokens of tool output, and asks for at most
``--tokens`` (64) tokens, greedy. Reported per server: mean and p90 time to first token
per turn, total time, and the tokens each server evaluated against the new tokens (1.0 =
perfect reuse: a turn's new tokens are its prompt less the previous turn's prompt and
answer; a first turn's are its task line, plus the shared system prompt once per run),
with the compute floor: evaluated tokens x the per-token prefill cost measured on the same
server (a fresh ~1,000-token prompt; longer contexts cost more per token).

    flock /tmp/llamaserve-bench.lock python bench/agents.py \
        --llama-server /tmp/llama-build/bin/llama-server

Prints the table and writes bench/results/agents.json. llama-server's build: see
bench/compare_servers.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from compare_servers import _port, _wait  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import Chart, out_dir, report  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": name, "description": desc,
    "parameters": {"type": "object", "properties": props,
                   "required": list(props)}}} for name, desc, props in [
    ("read_file", "Read a file of the repository and return its text.",
     {"path": {"type": "string", "description": "path relative to the repository root"}}),
    ("write_file", "Replace a file's whole content.",
     {"path": {"type": "string"}, "content": {"type": "string"}}),
    ("apply_patch", "Apply a unified diff to the working tree.",
     {"patch": {"type": "string", "description": "a unified diff"}}),
    ("run_tests", "Run the test suite, or one test file, and return the summary.",
     {"target": {"type": "string"}, "timeout": {"type": "integer"}}),
    ("search", "Search the repository for a regular expression.",
     {"pattern": {"type": "string"}, "glob": {"type": "string"}}),
    ("list_dir", "List a directory.", {"path": {"type": "string"}}),
    ("shell", "Run a shell command in the sandbox and return stdout and stderr.",
     {"command": {"type": "array", "items": {"type": "string"}},
      "workdir": {"type": "string"}}),
    ("git_diff", "Show the working tree's diff against HEAD.", {"paths": {
        "type": "array", "items": {"type": "string"}}}),
]]


TASK_TOKENS = 20  # "Task {n}: rename handler_{n} and fix its callers." and its template


def system_prompt(words: int) -> str:
    rng = random.Random(7)
    vocab = ["module", "function", "class", "test", "fixture", "config", "parser", "engine",
             "cache", "token", "request", "response", "stream", "error", "retry", "batch",
             "queue", "schema", "field", "value", "index", "commit", "branch", "patch", "diff",
             "review", "lint", "type", "import", "export", "build", "deploy"]
    rules = []
    for i in range(words // 12):
        rules.append(f"Rule {i}: " + " ".join(rng.choice(vocab) for _ in range(10)) + ".")
    return ("You are a coding agent working in a Python repository. Use the tools to read, "
            "change and test code. Keep answers short. " + " ".join(rules))


def tool_output(session: int, turn: int) -> str:
    rng = random.Random(session * 1000 + turn)
    lines = []
    for i in range(rng.randrange(12, 24)):  # ~150-300 tokens
        lines.append(f"src/pkg/mod_{rng.randrange(40)}.py:{rng.randrange(1, 900)}: "
                     f"def handler_{i}(request, cache_{rng.randrange(9)}): return None")
    return "Tool output:\n" + "\n".join(lines) + "\nWhat next? Answer in one sentence."


def turn(url: str, messages: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    body = {"model": "bench", "stream": True, "max_tokens": tokens, "temperature": 0,
            "messages": messages, "tools": TOOLS, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = None
    text = ""
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    piece += json.dumps(call.get("function") or {})
                if piece:
                    first = first or time.perf_counter()
                    text += piece
                if choice.get("finish_reason"):
                    first = first or time.perf_counter()
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    end = time.perf_counter()
    prompt = int(usage.get("prompt_tokens") or timings.get("prompt_n", 0)
                 + timings.get("cache_n", 0))
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = timings.get("cache_n", 0)
    completion = int(usage.get("completion_tokens") or timings.get("predicted_n", 0))
    return {"ttft": (first or end) - started, "total": end - started, "text": text,
            "prompt": prompt, "evaluated": prompt - int(cached), "completion": completion}


def run_sessions(url: str, system: str, sessions: int, turns: int, tokens: int
                 ) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    errors: list[str] = []

    def session(n: int) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {n}: rename handler_{n} and fix its callers."}]
        previous = 0  # the previous turn's prompt and answer
        try:
            for t in range(turns):
                rec = turn(url, messages, tokens)
                rec.update(session=n, turn=t, new=rec["prompt"] - previous if t else None)
                previous = rec["prompt"] + rec["completion"]
                with lock:
                    records.append(rec)
                messages.append({"role": "assistant", "content": rec["text"] or "OK."})
                messages.append({"role": "user", "content": tool_output(n, t)})
        except Exception as exc:
            errors.append(f"session {n}: {type(exc).__name__}: {exc}")

    started = time.perf_counter()
    threads = [threading.Thread(target=session, args=(n,)) for n in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[:3])
    return {"wall": time.perf_counter() - started, "records": records}


def prefill_cost(url: str, words: int) -> float:
    """Seconds per prompt token on this server: a fresh ~1,000-token prompt, 1 token out."""
    text = system_prompt(words).replace("Rule", "Note")
    body = {"model": "bench", "max_tokens": 1, "temperature": 0, "cache_prompt": False,
            "messages": [{"role": "user", "content": text + f" {time.time()}"}]}
    started = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return (time.perf_counter() - started) / r.json()["usage"]["prompt_tokens"]


def engine_time(url: str) -> dict[str, float]:
    """llamaserve's own account: seconds inside engine steps, steps, tokens decoded."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=30).text
    except httpx.HTTPError:
        return {}
    found: dict[str, float] = {}
    for line in text.splitlines():
        for key in ("llamaserve_engine_step_seconds_sum", "llamaserve_engine_step_seconds_count",
                    "llamaserve_engine_batch_tokens_sum"):
            if line.startswith(key + " "):
                found[key.removeprefix("llamaserve_engine_")] = float(line.split()[1])
    return found


def start_llamaserve(model: str, n_seq: int, threads: int, port: int, tmp: Path,
                     extra: dict[str, Any]) -> subprocess.Popen[bytes]:
    cfg = {"server": {"log_level": "warning"},
           "model": {"path": model, "alias": "bench", "n_ctx": 32768, "n_seq_max": n_seq,
                     "n_batch": 512, "n_ubatch": 512, "threads": threads,
                     "threads_batch": threads, **extra},
           "disk_cache": {"path": str(tmp / f"disk-{port}"), "max_bytes": 8 << 30,
                          "min_tokens": 128}}
    path = tmp / f"agents-{port}.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def start_llama_server(binary: str, model: str, n_seq: int, threads: int,
                       port: int) -> subprocess.Popen[bytes]:
    log = os.environ.get("BENCH_LOG")
    return subprocess.Popen(
        [binary, "-m", model, "--port", str(port), "-np", str(n_seq), "-c", str(32768),
         "-t", str(threads), "-tb", str(threads), "-b", "512", "-ub", "512",
         "--jinja", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=open(log or os.devnull, "wb"))


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--model", default=str(model_path("qwen-0.5b")))
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--words", type=int, default=1200, help="system prompt size (~2,000 tokens)")
    ap.add_argument("--llamaserve", default="split",
                    help="llamaserve variants, comma-separated: split (kv_unified false), "
                         "unified, budget (split with the default prefill_step_target)")
    args = ap.parse_args()
    system = system_prompt(args.words)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        servers: list[tuple[str, Callable[[int], subprocess.Popen[bytes]]]] = []
        for variant in args.llamaserve.split(","):
            # agent settings on a CPU (docs/BENCHMARKS.md "Agent sessions"): a KV stream per
            # sequence (attention spans only its own cells) and full prefill chunks (time to
            # first token over other streams' inter-token latency)
            extra: dict[str, Any] = {"kv_unified": variant == "unified",
                                     "prefill_step_target": 0}
            if variant == "budget":
                del extra["prefill_step_target"]
            name = "llamaserve" if variant == "split" else f"llamaserve ({variant})"
            servers.append((name, lambda port, extra=extra: start_llamaserve(
                args.model, args.n_seq, args.threads, port, tmp, extra)))
        if args.llama_server:
            servers.append(("llama-server", lambda port: start_llama_server(
                args.llama_server, args.model, args.n_seq, args.threads, port)))
        for name, start in servers:
            port = _port()
            proc = start(port)
            url = f"http://127.0.0.1:{port}"
            try:
                _wait(f"{url}/health", proc)
                cost = prefill_cost(url, 700)
                run = run_sessions(url, system, args.sessions, args.turns, args.tokens)
                run["engine"] = engine_time(url)
            finally:
                proc.terminate()
                proc.wait(60)
            run["cost"] = cost
            results[name] = run
            print(f"{name}: {run['wall']:.1f} s", file=sys.stderr, flush=True)
    rows: list[dict[str, object]] = []
    for name, run in results.items():
        recs = run["records"]
        # New tokens of a first turn: the task line (its prompt less the shared system
        # prompt and tools), and the shared part once for the whole run.
        firsts = [r for r in recs if r["turn"] == 0]
        shared = min(r["prompt"] for r in firsts) - TASK_TOKENS
        for r in firsts:
            r["new"] = r["prompt"] - shared
        firsts[0]["new"] += shared
        ttfts = [r["ttft"] for r in recs]
        evaluated = sum(r["evaluated"] for r in recs)
        new = sum(r["new"] for r in recs)
        rows.append({"server": name, "mean TTFT s": round(statistics.mean(ttfts), 2),
                     "p90 TTFT s": round(p90(ttfts), 2), "total s": round(run["wall"], 1),
                     "evaluated / new tokens": round(evaluated / max(new, 1), 2),
                     "evaluated tokens": evaluated,
                     "prefill ms/token": round(run["cost"] * 1000, 2),
                     "compute floor s": round(evaluated * run["cost"], 1),
                     "busy s": round(run.get("engine", {}).get("step_seconds_sum", 0), 1)})
    base = next((row for row in rows if row["server"] == "llama-server"), None)
    if base is not None:  # each llamaserve variant over llama-server
        for row in [row for row in rows if row is not base]:
            rows.append({"server": f"ratio {row['server']}", **{
                k: round(float(row[k]) / max(float(base[k]), 1e-9), 2)  # type: ignore[arg-type]
                for k in ("mean TTFT s", "p90 TTFT s", "total s")}})
    per_turn = {name: [round(statistics.mean(r["ttft"] for r in run["records"]
                                             if r["turn"] == t), 2)
                       for t in range(args.turns)] for name, run in results.items()}
    print("mean TTFT per turn:", json.dumps(per_turn), file=sys.stderr)
    p90_turn = {name: [round(p90([r["ttft"] for r in run["records"] if r["turn"] == t]), 2)
                       for t in range(args.turns)] for name, run in results.items()}
    print("p90 TTFT per turn:", json.dumps(p90_turn), file=sys.stderr)
    records = {name: run["records"] for name, run in results.items()}
    (out_dir() / "agents_records.json").write_text(json.dumps(records))
    report(rows, "agents", Chart("server", ["mean TTFT s", "p90 TTFT s"], "seconds",
                                 "Multi-turn agent sessions"))


if __name__ == "__main__":
    main()
