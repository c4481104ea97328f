"""Thinking, tools and structured output together, per template family (issue 34): valid
answers out of N seeded samples per case, llamaserve against llama-server on the same
files and the same templates.

The files are the tiny random-weight llamas of tests/make_family_models.py (Qwen2.5's
tokenizer plus the family's control tokens, the shipped config's chat template in the GGUF),
so nothing but the servers' grammars and budgets guide what they write. llamaserve runs
the shipped config (its template and response schema); llama-server runs
``--jinja --chat-template-file`` with the same template (its own parser and grammar for the
family). Each case (tests/plan_cases.py: required, named, auto and none tool choices,
json_schema, thinking on with a budget, off, and with no budget; per-request
``thinking_budget_tokens`` / ``reasoning_budget_tokens``, which both servers read) sends
the same N requests (seeds 0..N-1, temperature 1) non-streamed, 4 at a time; an answer is
valid as ``tests/plan_cases.problem`` says (calls in ``tool_calls`` valid against their
schema, JSON in ``content`` valid against its schema, reasoning in ``reasoning_content``,
none of the family's markup in the content).

    python bench/thinking_tools.py [--seeds 100] [--llama-server-seeds 20]
        [--families harmony gemma4 qwen35 hermes]
        [--llama-server /tmp/llama-build/bin/llama-server] [--threads 2]

Writes ``bench/results/thinking_tools.json``; ``--show N`` prints N failures per cell.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from make_family_models import chat_template, server_config, write_family_model  # noqa: E402
from plan_cases import Case, family_cases, problem, request  # noqa: E402

from report import report  # noqa: E402

PARALLEL = 4


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Until ``url`` (llamaserve's /healthz, llama-server's /health) answers 200."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("server did not become ready")


def env() -> dict[str, str]:
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def start_llamaserve(family: str, port: int, tmp: Path, threads: int
                     ) -> subprocess.Popen[bytes]:
    cfg = server_config(family, threads=threads, threads_batch=threads)
    cfg["server"] = {**cfg.get("server", {}), "log_level": "warning"}  # type: ignore[dict-item]
    path = tmp / f"{family}.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C", str(path),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env(), cwd=ROOT)


def start_llama_server(binary: str, family: str, port: int, tmp: Path, threads: int
                       ) -> subprocess.Popen[bytes]:
    template = tmp / f"{family}.jinja"
    template.write_text(chat_template(family))
    cmd = [binary, "-m", str(write_family_model(family)), "--port", str(port), "-np", "4",
           "-c", "4096", "-t", str(threads), "-tb", str(threads), "--no-webui", "--jinja",
           "--chat-template-file", str(template)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env())


def sample(url: str, family: str, case: Case, seed: int) -> str | None:
    """The problem with one answer (None: valid)."""
    try:
        r = httpx.post(url + "/v1/chat/completions", json=request(case, seed), timeout=300)
    except httpx.HTTPError as exc:
        return f"HTTP error {exc!r}"
    if r.status_code != 200:
        return f"{r.status_code} {r.text[:120]}"
    choice = r.json()["choices"][0]
    return problem(family, case, choice["message"], choice.get("finish_reason"))


def run_cases(url: str, family: str, seeds: int, show: int, label: str
              ) -> dict[str, tuple[int, str]]:
    """Per case: valid answers, and the commonest problem of the others."""
    valid: dict[str, tuple[int, str]] = {}
    with ThreadPoolExecutor(PARALLEL) as pool:
        for case in family_cases(family):
            problems = list(pool.map(lambda s, c=case: sample(url, family, c, s),
                                     range(seeds)))
            common = Counter(p.split(":")[0][:70] for p in problems if p is not None)
            n = sum(p is None for p in problems)
            valid[case.name] = (n, common.most_common(1)[0][0] if common else "")
            print(f"  {label} {family} {case.name}: {n}/{seeds}"
                  + (f"  ({dict(common.most_common(3))})" if common else ""), flush=True)
            for p in [p for p in problems if p is not None][:show]:
                print(f"    {p[:300]}", flush=True)
    return valid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--families", nargs="+", default=["harmony", "gemma4", "qwen35", "hermes"])
    ap.add_argument("--servers", nargs="+", default=["llamaserve", "llama-server"])
    ap.add_argument("--llama-server-seeds", type=int, default=None,
                    help="fewer seeds for llama-server (default: --seeds)")
    ap.add_argument("--llama-server", default=os.environ.get(
        "LLAMA_SERVER", "/tmp/llama-build/bin/llama-server"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--show", type=int, default=0)
    args = ap.parse_args()
    results: dict[tuple[str, str], dict[str, tuple[int, str]]] = {}
    seeds = {server: args.seeds for server in args.servers}
    if args.llama_server_seeds is not None:
        seeds["llama-server"] = args.llama_server_seeds
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for family in args.families:
            write_family_model(family)
            for server in args.servers:
                port = free_port()
                proc = start_llamaserve(family, port, tmp, args.threads) \
                    if server == "llamaserve" else \
                    start_llama_server(args.llama_server, family, port, tmp, args.threads)
                url = f"http://127.0.0.1:{port}"
                try:
                    wait_ready(url + ("/health" if server == "llama-server" else "/healthz"),
                               proc)
                    results[(family, server)] = run_cases(url, family, seeds[server],
                                                          args.show, server)
                finally:
                    proc.terminate()
                    proc.wait(30)
    rows: list[dict[str, object]] = []
    for family in args.families:
        for case in family_cases(family):
            row: dict[str, object] = {"family": family, "case": case.name}
            for server in args.servers:
                got = results.get((family, server), {}).get(case.name)
                row[server] = "" if got is None else f"{got[0]}/{seeds[server]}"
            for server in args.servers:
                got = results.get((family, server), {}).get(case.name)
                row[f"{server} mostly"] = got[1] if got else ""
            rows.append(row)
    report(rows, "thinking_tools")


if __name__ == "__main__":
    main()
