"""MTP drafting on a trained file: llamaserve's ``draft-mtp`` against llama-server's
``--spec-type draft-mtp``, on the same tiny trained Qwen3.5-architecture GGUF.

Five servers side by side, taking turns: llamaserve without drafts, with ``draft_model:
"draft-mtp"`` (it drafts when its cost model expects a gain) and with ``draft-mtp``
drafting at every step (the allocator patched in that server process, as llama-server
drafts), llama-server without drafts and with ``--spec-type draft-mtp``; drafts of at most
``--draft-max`` tokens (llama-server's default, 3). Each runs four code continuations
(``/v1/completions``, greedy, ``--tokens`` each) one after another (1 stream) and all at
once (4 streams); best of ``--rounds`` for tokens/s.

Columns: tokens/s end to end, the ratio to the same server without drafts, drafted tokens
accepted (llamaserve: ``/metrics``; llama-server: ``timings.draft_n`` /
``draft_n_accepted``), and whether every text equals llamaserve's and llama-server's
text without drafts at the same stream count.

The model comes from ``bench/make_mtp_model.py`` (torch, in a separate venv): a model of
width 128 trained for minutes on standard-library sources. It tests the MTP plumbing, not
the quality of any real MTP model.

    flock /tmp/llamaserve-bench.lock python bench/mtp.py \\
        [--llama-server /tmp/llama-build/bin/llama-server] [--model X.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from compare_servers import _port, _wait  # noqa: E402
from fetch_models import cache_dir  # noqa: E402
from report import Chart, report  # noqa: E402

MODEL = "qwen35-mtp-trained.gguf"  # bench/make_mtp_model.py (not imported: it needs torch)

PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv=None):\n    \"\"\"Parse the command line "
    "and run.\"\"\"\n    if argv is None:\n        argv = sys.argv[1:]\n",
    "class Reader:\n    \"\"\"Read records from a file object.\"\"\"\n\n    def __init__(self, "
    "f, encoding=None):\n        self.f = f\n",
    "def _check_name(name):\n    if not isinstance(name, str):\n        raise TypeError("
    "'name must be a string, not %r' % (type(name).__name__,))\n",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, self.",
]


@dataclass
class Run:
    tps: float
    texts: list[str]
    drafted: int
    accepted: int


def complete(url: str, prompt: str, tokens: int) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", timeout=1200, json={
        "model": "bench", "prompt": prompt, "max_tokens": tokens, "temperature": 0})
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def draft_counts(url: str) -> tuple[int, int]:
    """llamaserve's drafted and accepted tokens so far (0, 0 where not exported)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return 0, 0
    got = {"llamaserve_draft_tokens_proposed_total": 0.0,
           "llamaserve_draft_tokens_accepted_total": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in got:
            got[name] = float(value)
    return (int(got["llamaserve_draft_tokens_proposed_total"]),
            int(got["llamaserve_draft_tokens_accepted_total"]))


def run(url: str, streams: int, tokens: int) -> Run:
    """The four prompts one after another (1 stream) or all at once."""
    before = draft_counts(url)
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        bodies = list(pool.map(lambda p: complete(url, p, tokens), PROMPTS))
    elapsed = time.perf_counter() - start
    after = draft_counts(url)
    drafted, accepted = after[0] - before[0], after[1] - before[1]
    for b in bodies:  # llama-server's own counts
        timings = b.get("timings") or {}
        drafted += int(timings.get("draft_n", 0))
        accepted += int(timings.get("draft_n_accepted", 0))
    n = sum(int(b["usage"]["completion_tokens"]) for b in bodies)
    return Run(n / elapsed, [b["choices"][0]["text"] for b in bodies], drafted, accepted)


# llamaserve drafts when its cost model expects a gain (engine.drafts.policy.allocate). On
# this file a drafted token costs about a whole target step (the 151,936-row LM head
# dominates a model of width 128, and the MTP head runs it too), so it mostly does not; the
# "every step" row patches the allocator in the server process to draft the longest
# allowed draft at every step, as llama-server does, for a like-for-like acceptance rate.
ALWAYS_DRAFT = (
    "import sys; import engine.drafts.coordinator as d; "
    "d.allocate = lambda chances, base, limit, *a, **k: [len(c) for c in chances]; "
    "import server; sys.exit(server.main())")


def start_llamaserve(model: str, args: argparse.Namespace, mode: str, port: int,
                     tmp: Path) -> subprocess.Popen[bytes]:
    cfg: dict[str, Any] = {
        "server": {"log_level": "warning"},
        "model": {"path": model, "alias": "bench", "n_ctx": 4096, "n_seq_max": 4,
                  "n_batch": 512, "n_ubatch": 512, "threads": args.threads,
                  "threads_batch": args.threads}}
    if mode != "none":
        cfg["model"].update(draft_model="draft-mtp", draft_model_num_pred_tokens=args.draft_max)
    path = tmp / f"mtp-bench-{port}.json"
    path.write_text(json.dumps(cfg))
    entry = ["-c", ALWAYS_DRAFT] if mode == "every step" else [str(ROOT / "server.py")]
    return subprocess.Popen([sys.executable, *entry, "-C", str(path), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=log_file(), env=server_env(),
                            cwd=ROOT)


def start_llama_server(model: str, args: argparse.Namespace, mode: str, port: int
                       ) -> subprocess.Popen[bytes]:
    cmd = [args.llama_server, "-m", model, "--port", str(port), "-np", "4", "-c", "4096",
           "-t", str(args.threads), "-tb", str(args.threads), "-b", "512", "-ub", "512",
           "--no-webui"]
    if mode != "none":
        cmd += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(args.draft_max)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file(),
                            env=server_env())


def server_env() -> dict[str, str]:
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}


def log_file() -> Any:
    return open(os.environ.get("BENCH_LOG") or os.devnull, "ab")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get(
        "LLAMA_SERVER", "/tmp/llama-build/bin/llama-server"))
    ap.add_argument("--model", default=str(cache_dir() / "test-models" / MODEL))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not Path(args.model).exists():
        sys.exit(f"{args.model} is missing: run bench/make_mtp_model.py with torch first")
    configs: list[tuple[str, str]] = [("llamaserve", "none"), ("llamaserve", "draft-mtp"),
                                      ("llamaserve", "every step")]
    if Path(args.llama_server).exists():
        configs += [("llama-server", "none"), ("llama-server", "draft-mtp")]
    results: dict[tuple[str, str, int], Run] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # all servers up at once, taking turns (this machine's speed drifts over minutes:
        # alternating keeps the drift out of the ratios); idle ones cost nothing
        servers: dict[tuple[str, str], tuple[subprocess.Popen[bytes], str]] = {}
        try:
            for name, mode in configs:
                port = _port()
                proc = (start_llamaserve(args.model, args, mode, port, Path(tmp))
                        if name == "llamaserve" else
                        start_llama_server(args.model, args, mode, port))
                servers[name, mode] = (proc, f"http://127.0.0.1:{port}")
            for proc, url in servers.values():
                _wait(f"{url}/health", proc)
                complete(url, "def f(x):\n", 8)  # warm-up
            for streams in (1, 4):
                for _ in range(args.rounds):
                    for (name, mode), (_, url) in servers.items():
                        got = run(url, streams, args.tokens)
                        best = results.get((name, mode, streams))
                        if best is not None and got.texts != best.texts:
                            print(f"{name} {mode} x{streams}: texts differ between rounds",
                                  file=sys.stderr)
                        if best is None or got.tps > best.tps:
                            results[name, mode, streams] = got
                for name, mode in configs:
                    r = results[name, mode, streams]
                    print(f"{name} {mode} x{streams}: {r.tps:.1f} tok/s, "
                          f"{r.accepted}/{r.drafted} accepted", file=sys.stderr)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
            for proc, _ in servers.values():
                proc.wait(60)
    rows: list[dict[str, object]] = []
    for streams in (1, 4):
        for name, mode in configs:
            r = results[name, mode, streams]
            plain = results[name, "none", streams]
            ours = results["llamaserve", "none", streams]
            theirs = results.get(("llama-server", "none", streams))
            drafts = mode != "none"
            rows.append({
                "config": f"{name} {mode} x{streams}", "server": name, "drafts": mode,
                "streams": streams, "tok/s": round(r.tps, 1),
                "vs no drafts": round(r.tps / plain.tps, 2),
                "accepted": f"{r.accepted}/{r.drafted}" if drafts else "",
                "acceptance": round(r.accepted / r.drafted, 3) if drafts and r.drafted else "",
                "= llamaserve": r.texts == ours.texts,
                "= llama-server": "" if theirs is None else r.texts == theirs.texts})
    report(rows, "mtp", Chart("config", ["tok/s"], "tokens/s",
                              "MTP drafting on a tiny trained Qwen3.5-architecture model"))


if __name__ == "__main__":
    main()
