"""Drafts on real edits: llamaserve's prompt lookup against llama-server's n-gram
speculative types, on code edits with scattered changes (bench/edit_corpus.py).

All servers run side by side on Qwen2.5-Coder-0.5B (2 threads, greedy) and take turns on
every request, so this machine's drift hits them alike:

  llamaserve   no drafts; prompt lookup with defaults; with draft_model_num_pred_tokens 8, 16
  llama-server no spec; --spec-type ngram-map-k, ngram-mod, ngram-simple (their defaults)

1 stream: each kind of edit once (rename, signature, insert, reformat), tokens/s per kind
and over all four, end to end (prefill included). 8 streams: the 8 edits of the corpus at
once, the first 160 tokens of each answer (``--max-tokens-8``; whole answers take minutes
per config on 2 cores), after an untimed 1-token request per edit has prefilled the
prompts (the prefix caches of both servers keep them): decoding speed under load.
Reports absolute tokens/s end to end, each llamaserve draft config against llama-server's
best n-gram type, and whether every text equals the same server's text without drafts.

    python bench/edits.py --llama-server /tmp/llama-build/bin/llama-server [--quick]
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from compare_servers import _port, _wait  # noqa: E402
from conftest import qwen_config, start_server  # noqa: E402
from edit_corpus import EDITS, Edit, first_of_each_kind, messages  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import Chart, report  # noqa: E402

N_CTX = 16384


@dataclass
class Server:
    name: str  # "ls none", "lcpp ngram-mod", ...
    family: str  # "llamaserve" or "llama-server"
    url: str
    stop: Callable[[], None]


@dataclass
class Result:
    tokens: int = 0
    seconds: float = 0.0
    texts: list[str] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def llamaserve(name: str, tmp: Path, **drafts: Any) -> Server:
    cfg = qwen_config(n_seq_max=8, n_ctx=N_CTX, **drafts)
    cfg["server"]["log_level"] = "warning"
    s = start_server(cfg, tmp)
    return Server(name, "llamaserve", s.url, s.stop)


def llama_server(binary: str, name: str, spec: list[str]) -> Server:
    port = _port()
    proc = subprocess.Popen(
        [binary, "-m", str(model_path("qwen-0.5b")), "--port", str(port), "-np", "8", "-cb",
         "-c", str(N_CTX), "-t", "2", "-tb", "2", "-b", "512", "-ub", "512", "--kv-unified",
         "--no-webui", *spec], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}/health", proc)

    def stop() -> None:
        proc.terminate()
        proc.wait(30)
    return Server(name, "llama-server", f"http://127.0.0.1:{port}", stop)


def run(server: Server, edits: list[Edit], max_tokens: int) -> Result:
    def one(edit: Edit) -> tuple[str, int, int, int]:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=1200, json={
            "model": "x", "messages": messages(edit), "temperature": 0,
            "max_tokens": max_tokens})
        r.raise_for_status()
        body = r.json()
        timings = body.get("timings", {})  # llama-server: its drafts
        return (body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"],
                timings.get("draft_n", 0), timings.get("draft_n_accepted", 0))

    metrics = _draft_metrics(server)
    start = time.perf_counter()
    with ThreadPoolExecutor(len(edits)) as pool:
        results = list(pool.map(one, edits))
    elapsed = time.perf_counter() - start
    after = _draft_metrics(server)
    out = Result(sum(r[1] for r in results), elapsed, [r[0] for r in results],
                 sum(r[2] for r in results), sum(r[3] for r in results))
    if server.family == "llamaserve":
        out.drafted, out.accepted = after[0] - metrics[0], after[1] - metrics[1]
    return out


def _draft_metrics(server: Server) -> tuple[int, int]:
    if server.family != "llamaserve":
        return 0, 0
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line.startswith("llamaserve_draft_tokens_"):
            key, value = line.rsplit(" ", 1)
            values[key.split("{")[0]] = int(float(value))
    return (values.get("llamaserve_draft_tokens_proposed_total", 0),
            values.get("llamaserve_draft_tokens_accepted_total", 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get(
        "LLAMA_SERVER", "/tmp/llama-build/bin/llama-server"))
    ap.add_argument("--max-tokens", type=int, default=600, help="per request, 1 stream")
    ap.add_argument("--max-tokens-8", type=int, default=160,
                    help="per request, 8 streams (the first part of each answer: time)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--all-types", action="store_true",
                    help="also ngram-simple (drafts exactly as ngram-map-k with defaults)")
    ap.add_argument("--quick", action="store_true",
                    help="rename + signature only, no k16 / ngram-simple, 320 / 120 tokens")
    args = ap.parse_args()
    single = first_of_each_kind()
    many = EDITS
    ls_configs: list[tuple[str, dict[str, Any]]] = [
        ("ls none", {}), ("ls lookup", {"draft_model": "prompt-lookup-decoding"}),
        ("ls lookup k8", {"draft_model": "prompt-lookup-decoding",
                          "draft_model_num_pred_tokens": 8}),
        ("ls lookup k16", {"draft_model": "prompt-lookup-decoding",
                           "draft_model_num_pred_tokens": 16})]
    lcpp_configs = [("lcpp none", []), ("lcpp ngram-map-k", ["--spec-type", "ngram-map-k"]),
                    ("lcpp ngram-mod", ["--spec-type", "ngram-mod"])]
    if args.all_types:
        lcpp_configs.append(("lcpp ngram-simple", ["--spec-type", "ngram-simple"]))
    if args.quick:
        single = single[:2]
        ls_configs = ls_configs[:3]
        lcpp_configs = lcpp_configs[:3]
        args.max_tokens = min(args.max_tokens, 320)
        args.max_tokens_8 = min(args.max_tokens_8, 120)
    servers: list[Server] = []
    results: dict[tuple[str, int, str], Result] = {}  # (server, streams, kind)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, drafts in ls_configs:
                servers.append(llamaserve(name, Path(tmp), **drafts))
            for name, spec in lcpp_configs:
                servers.append(llama_server(args.llama_server, name, spec))
            for server in servers:
                run(server, [Edit("warm-up", "x = 1\n", "Rename x to y.")], 8)
            for round_ in range(args.rounds):
                order = servers if round_ % 2 == 0 else servers[::-1]
                batches = [(1, e.kind, [e], args.max_tokens) for e in single] + [
                    (len(many), "8 edits", many, args.max_tokens_8)]
                for streams, kind, edits, max_tokens in batches:
                    for server in order:
                        if streams > 1:  # prompts prefilled untimed: 8 prompts take ~25 s
                            run(server, edits, 1)  # here, which would hide the decoding
                        res = run(server, edits, max_tokens)
                        key = (server.name, streams, kind)
                        if key not in results or res.tps > results[key].tps:
                            results[key] = res
                        print(f"{server.name:18} streams={streams} {kind:9} "
                              f"{res.tps:6.1f} tok/s  {res.tokens} tokens  "
                              f"drafts {res.accepted}/{res.drafted}", file=sys.stderr)
        finally:
            for server in servers:
                server.stop()
    names = [s.name for s in servers]
    rows = []
    groups = [(1, e.kind) for e in single] + [(1, "all")] + [(len(many), "8 edits")]
    for name in names:  # 1 stream over all kinds: total tokens / total time
        parts = [results[name, 1, e.kind] for e in single]
        results[name, 1, "all"] = Result(sum(p.tokens for p in parts),
                                         sum(p.seconds for p in parts),
                                         [t for p in parts for t in p.texts],
                                         sum(p.drafted for p in parts),
                                         sum(p.accepted for p in parts))
    for streams, kind in groups:
        row: dict[str, object] = {"streams": streams, "kind": kind}
        for name in names:
            row[name] = round(results[name, streams, kind].tps, 1)
        spec = [n for n in names if n.startswith("lcpp ") and n != "lcpp none"]
        best = max(spec, key=lambda n: results[n, streams, kind].tps) if spec else None
        for name in names:
            if name.startswith("ls lookup") and best is not None:
                row[f"{name[3:]}/best"] = round(results[name, streams, kind].tps
                                               / results[best, streams, kind].tps, 2)
        if best is not None:
            row["best ngram"] = best[5:]
        differ = [n for n in names if n.split()[0] == "ls" and results[n, streams, kind].texts
                  != results["ls none", streams, kind].texts] + [
                  n for n in names if n.startswith("lcpp") and results[n, streams, kind].texts
                  != results["lcpp none", streams, kind].texts]
        row["identical"] = "all" if not differ else "not " + ",".join(differ)
        rows.append(row)
    accepted = {n: f"{results[n, 1, 'all'].accepted}/{results[n, 1, 'all'].drafted}"
                for n in names}
    texts = {kind: results["ls none", streams, kind].texts for streams, kind in groups}
    (Path(os.environ.get("BENCH_OUT", ROOT / "bench" / "results")) / "edits_texts.json").write_text(
        json.dumps(texts, indent=1) + "\n")  # the no-draft answers (for bench/edits_replay.py)
    print("accepted/drafted, 1 stream over all kinds:", json.dumps(accepted), file=sys.stderr)
    report(rows, "edits", Chart("kind", names, "tokens/s (end to end)",
                                "Scattered-change code edits, Qwen2.5-Coder-0.5B, 2-core CPU"))


if __name__ == "__main__":
    main()
