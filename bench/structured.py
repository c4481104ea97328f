"""Structured output: tokens/s of a ``response_format`` json_schema answer and of a forced
tool call (``tool_choice`` naming a function) vs the same prompt unconstrained, at 1 and 8
concurrent streams, on llamaserve and on llama.cpp's llama-server, one run, one table.

Each request asks for ``--tokens`` tokens (non-streamed, ``ignore_eos``); the schema has an
array with ``minItems`` large enough that the JSON cannot end before ``max_tokens``, so every
mode generates the same number of tokens (the table reports them). Sampling is llama.cpp's
default (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05) sent explicitly to both servers.
The servers run one after the other, never at once. The forced call's baseline is
``free (same prompt)``: its own prompt (the server's ``/apply-template`` of the same body,
tool listed) continued unconstrained on ``/v1/completions``, so the two differ only in the
constraint (for a template that writes its own BOS, ``/v1/completions`` would add a second:
the Qwen models here have none).

    python bench/structured.py --llama-server /tmp/llama-build/bin/llama-server

``--servers llamaserve,llamaserve=/path/to/other/checkout`` compares two checkouts of
llamaserve in one run. ``--py-spy OUT.txt`` records the llamaserve process with py-spy
(``--native``) during its constrained levels and writes the collapsed stacks to OUT.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from compare_servers import _port, _wait  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import report  # noqa: E402

PROMPT = ("Write the inventory of a small hardware shop as JSON: an object with a title, "
          "a status and a list of at least 40 items; each item has a name, a category, a "
          "list of tags, a priority and details (owner and whether it is in stock).")

ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "category": {"enum": ["tools", "garden", "paint", "plumbing", "electrical"]},
        "tags": {"type": "array", "items": {"enum": ["new", "sale", "popular", "heavy",
                                                     "fragile"]},
                 "minItems": 1, "maxItems": 3},
        "priority": {"type": "integer"},
        "details": {"type": "object",
                    "properties": {"owner": {"type": "string"},
                                   "in_stock": {"type": "boolean"}},
                    "required": ["owner", "in_stock"]},
    },
    "required": ["name", "category", "tags", "priority", "details"],
}
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "status": {"enum": ["open", "closed", "audit"]},
        "items": {"type": "array", "items": ITEM, "minItems": 40},
    },
    "required": ["title", "status", "items"],
}
TOOL = {"type": "function", "function": {
    "name": "save_inventory", "description": "Store a shop inventory.", "parameters": SCHEMA}}
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}

MODES: dict[str, dict[str, Any]] = {
    "free": {},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "inventory", "schema": SCHEMA, "strict": True}}},
    "tool call": {"tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "save_inventory"}}},
    # the tool call's baseline: the tool listed, no call asked for. llama-server renders
    # the tool into the prompt under tool_choice none; llamaserve leaves it out, so its
    # baseline is the plain prompt (the table's prompt column shows which)
    "free (tool listed)": {"tools": [TOOL], "tool_choice": "none"},
    # the tool call's fair baseline on every server: the forced call's own prompt (the
    # server's /apply-template of the same body) continued unconstrained on /v1/completions
    "free (same prompt)": {},
}
SAME_PROMPT = "free (same prompt)"
BASELINE = {"tool call": SAME_PROMPT}  # vs free: against this mode when it ran
_rendered: dict[str, str] = {}  # the tool call's prompt, by server URL


@dataclass
class Level:
    tokens: int = 0
    prompt_tokens: int = 0
    requests: int = 0
    errors: int = 0
    wall: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0


async def _one(http: httpx.AsyncClient, url: str, mode: str, tokens: int, seed: int,
               res: Level) -> None:
    body = {"model": "bench", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens, "ignore_eos": True, "seed": seed, **SAMPLING,
            **MODES[mode]}
    route = "chat/completions"
    if mode == SAME_PROMPT:
        if url not in _rendered:
            t = await http.post(url.removesuffix("/v1") + "/apply-template",
                                json={**body, **MODES["tool call"]})
            t.raise_for_status()
            _rendered[url] = t.json()["prompt"]
        del body["messages"]
        body["prompt"], route = _rendered[url], "completions"
    r = await http.post(f"{url}/{route}", json=body)
    if r.status_code != 200:
        res.errors += 1
        print(f"  {mode}: HTTP {r.status_code} {r.text[:200]}", file=sys.stderr)
        return
    res.requests += 1
    res.tokens += int(r.json()["usage"]["completion_tokens"])
    res.prompt_tokens += int(r.json()["usage"]["prompt_tokens"])


async def run_level(url: str, mode: str, streams: int, tokens: int, rounds: int) -> Level:
    res = Level()
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        await _one(http, url, mode, 4, 0, Level())  # warm-up (grammar, prefix cache)

        async def client(i: int) -> None:
            for k in range(rounds):
                await _one(http, url, mode, tokens, 1000 * i + k + 1, res)

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(streams)))
        res.wall = time.perf_counter() - start
    return res


def start_llamaserve(model: str, n_seq: int, threads: int, port: int, tmp: Path,
                     root: Path = ROOT) -> subprocess.Popen[bytes]:
    cfg = json.loads((ROOT / "configs" / "qwen2.5-coder-0.5b.json").read_text())
    cfg["server"] = {"log_level": "warning"}
    cfg["model"].update({"path": model, "alias": "bench", "n_ctx": 16384, "n_seq_max": n_seq,
                         "threads": threads, "threads_batch": threads})
    path = tmp / "structured.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(root / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=root)


def start_llama_server(binary: str, model: str, n_seq: int, threads: int,
                       port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([binary, "-m", model, "--port", str(port), "-np", str(n_seq), "-cb",
                             "-c", "16384", "-t", str(threads), "-tb", str(threads), "-b", "512",
                             "-ub", "512", "--kv-unified", "--no-webui", "--jinja"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_server(args: argparse.Namespace, name: str, rep: int, modes: list[str],
               streams: list[int], n_seq: int, tmp: Path,
               runs: dict[tuple[str, str, int], list[Level]]) -> None:
    port = _port()
    _rendered.clear()  # (a port the last server had: its prompt is not this one's)
    proc = (start_llamaserve(args.model, n_seq, args.threads, port, tmp,
                             Path(name.partition("=")[2] or args.root))
            if name.startswith("llamaserve") else
            start_llama_server(args.llama_server, args.model, n_seq, args.threads, port))
    spy = None
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc)
        for mode in modes:
            if args.py_spy and name.startswith("llamaserve") and mode != "free" \
                    and spy is None and rep == 0:
                spy = subprocess.Popen(["py-spy", "record", "--native", "-r", "50",
                                        "-f", "raw", "-o", args.py_spy,
                                        "-p", str(proc.pid)], stdout=subprocess.DEVNULL)
            for s in streams:
                rounds = args.rounds if s == 1 else 1
                res = asyncio.run(run_level(f"http://127.0.0.1:{port}/v1", mode, s,
                                            args.tokens, rounds))
                runs.setdefault((name, mode, s), []).append(res)
                print(f"[{rep}] {name} {mode} streams={s}: {res.tok_s:.1f} tok/s "
                      f"({res.tokens} tokens, {res.errors} errors)", file=sys.stderr)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER",
                                                             "/tmp/llama-build/bin/llama-server"))
    ap.add_argument("--model", default=str(model_path("qwen-0.5b")))
    ap.add_argument("--servers", default="llamaserve,llama-server")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream at 1 stream")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of every server in turn; the table takes each cell's median")
    ap.add_argument("--py-spy", default="", help="collapsed py-spy stacks of llamaserve")
    ap.add_argument("--name", default="structured")
    ap.add_argument("--root", default=str(ROOT),
                    help="the llamaserve checkout to run (e.g. an older commit, to compare)")
    args = ap.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    modes = args.modes.split(",")
    names = args.servers.split(",")
    n_seq = max(streams)
    runs: dict[tuple[str, str, int], list[Level]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeat):  # every server once per repeat, in turn
            for name in names:
                run_server(args, name, rep, modes, streams, n_seq, Path(tmp), runs)
    results = {key: sorted(levels, key=lambda x: x.tok_s)[len(levels) // 2]
               for key, levels in runs.items()}  # the median round
    rows: list[dict[str, object]] = []
    for name in names:
        for mode in modes:
            for s in streams:
                got = results.get((name, mode, s))
                if got is None:
                    continue
                free = results.get((name, BASELINE.get(mode, "free"), s)) or \
                    results.get((name, "free", s))
                other = results.get(("llama-server", mode, s))
                rows.append({
                    "server": name, "mode": mode, "streams": s,
                    "tokens": got.tokens, "errors": got.errors,
                    "prompt": got.prompt_tokens // max(got.requests, 1),
                    "tok/s": round(got.tok_s, 1),
                    "vs free": round(got.tok_s / free.tok_s, 3) if free and free.tok_s else "",
                    "vs llama-server": (round(got.tok_s / other.tok_s, 3)
                                        if other and other.tok_s else ""),
                })
    report(rows, args.name)


if __name__ == "__main__":
    main()
