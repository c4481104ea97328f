"""bench/step_overhead.py's not-streamed cells cross-checked by a client this project did not
write: ApacheBench (``ab``, Debian's apache2-utils), beside bench/light_client.py, on both
servers in the same run.

Both servers start at once on the same file (the tiny random-weight llama by default, 64
sequences, the same context and threads as bench/step_overhead.py). For each concurrency,
each round measures every (server, client) pair in turn, so a cell's four figures lie
minutes apart at most; ``--rounds`` rounds, the median kept, and each round's ratio shown so
that a cell that falls low in one round is seen. ``ab`` sends ``-n`` identical
``/v1/completions`` requests of exactly ``--tokens`` tokens (``ignore_eos``), ``-c`` at a
time, a new connection each; its tokens/s is requests x tokens over its own "Time taken for
tests", and a request that fails to connect or be read (or is not 2xx) fails the run.

    python bench/outside_client.py [--llama-server PATH] [--concurrency 1,4,16,64]

Writes bench/results/outside_client.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from make_tiny_model import write_tiny_model  # noqa: E402
from step_overhead import N_SEQ, drive, start_llama_server, start_llamaserve, warm  # noqa: E402

from report import report  # noqa: E402

PROMPT = "Once upon a time"


def ab(port: int, concurrency: int, tokens: int, requests: int, body: Path) -> float:
    """Tokens/s of ``requests`` not-streamed completions through ApacheBench."""
    done = subprocess.run(["ab", "-q", "-n", str(requests), "-c", str(concurrency), "-p", str(body),
                           "-T", "application/json", "-s", "600",
                           f"http://127.0.0.1:{port}/v1/completions"],
                          capture_output=True, text=True, check=True, timeout=1800)
    out = done.stdout
    # ab counts a body whose length differs from the first one's as failed ("Length"):
    # generated text varies; only a connection, receive or other error is a failure
    broken = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: \d+, Exceptions: (\d+)\)",
                       out)
    non2xx = re.search(r"Non-2xx responses:\s+(\d+)", out)
    if (broken and any(int(n) for n in broken.groups())) or non2xx:
        raise RuntimeError(f"ab saw failures on port {port}:\n{out}")
    seconds = float(re.search(r"Time taken for tests:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return requests * tokens / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", default="/tmp/llama-build/bin/llama-server")
    ap.add_argument("--model", default=None, help="default: the tiny model (written if missing)")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=8192, help="tokens per cell and client")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = args.model or str(write_tiny_model())
    ctx = N_SEQ * (args.tokens + 64)
    levels = [int(c) for c in args.concurrency.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body.json"
        body.write_text(json.dumps({"prompt": PROMPT, "max_tokens": args.tokens,
                                    "n_predict": args.tokens, "ignore_eos": True}))
        servers = {}
        try:
            servers["llamaserve"] = start_llamaserve(model, args.threads, ctx, Path(tmp))
            servers["llama-server"] = start_llama_server(args.llama_server, model,
                                                         args.threads, ctx, Path(tmp))
            for proc, port in servers.values():
                warm(proc.pid, port)
            for c in levels:
                per_client = max(2, args.budget // (c * args.tokens))  # light_client: per client
                seen: dict[tuple[str, str], list[float]] = {}
                for _ in range(args.rounds):
                    for client in ("ab", "light_client"):
                        for name, (_, port) in servers.items():
                            tok_s = (ab(port, c, args.tokens, per_client * c, body)
                                     if client == "ab" else
                                     drive(port, c, args.tokens, per_client, False)["tok_s"])
                            seen.setdefault((client, name), []).append(tok_s)
                            print(f"c={c} {client} {name}: {tok_s:.0f} tok/s", file=sys.stderr,
                                  flush=True)
                for client in ("ab", "light_client"):
                    ours, theirs = seen[(client, "llamaserve")], seen[(client, "llama-server")]
                    rows.append({
                        "client": client, "c": c,
                        "llamaserve tok/s": round(statistics.median(ours)),
                        "llama-server tok/s": round(statistics.median(theirs)),
                        "ratio (medians)": round(statistics.median(ours)
                                                 / statistics.median(theirs), 2),
                        "ratio per round": " ".join(f"{a / b:.2f}"
                                                    for a, b in zip(ours, theirs, strict=True))})
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)
    report(rows, "outside_client")


if __name__ == "__main__":
    main()
