"""Cold start: process start to the first token of a ~2,000-token prompt.

Runs, one server at a time, on the same GGUF and settings (the model file is read once
first, so every run finds it in the OS page cache):

- llama-server cold: a new process, the prompt;
- llama-server warm (``--slot-save-path``): a new process that restores the slot saved by
  the previous one (``POST /slots/0?action=restore``), then the prompt;
- llamaserve cold: a new process with an empty ``disk_cache`` directory;
- llamaserve warm: a new process on the directory the cold one filled when it stopped
  (SIGTERM saves the cached sequences).

The clock starts just before the process is spawned; ``/health`` is polled every
``--poll`` seconds; the prompt is streamed with ``max_tokens`` 1. ``ready s`` is when
``/health`` first answered 200. The median of ``--repeats`` runs is reported.

    flock /tmp/llamaserve-bench.lock python bench/cold_start.py \\
        --llama-server /tmp/llama-build/bin/llama-server
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from fairness import long_prompt  # noqa: E402

from compare_servers import _port  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import Chart, report  # noqa: E402

Start = Callable[[int], subprocess.Popen[bytes]]
Hook = Callable[[httpx.Client, str], object]  # (client, server URL): a call before/after


def first_token(port: int, proc: subprocess.Popen[bytes], prompt: str, poll: float,
                before: Hook | None = None) -> tuple[float, float]:
    """Seconds from now to /health answering 200, and to the prompt's first token."""
    start = time.perf_counter()
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=600) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if http.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(poll)
        ready = time.perf_counter() - start
        if before is not None:
            before(http, url)
        body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "stream": True,
                "temperature": 0.0, "id_slot": 0, "cache_prompt": True}
        with http.stream("POST", f"{url}/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                    return ready, time.perf_counter() - start
    raise RuntimeError("no token")


def timed(start: Start, prompt: str, poll: float, before: Hook | None = None,
          after: Hook | None = None) -> tuple[float, float]:
    port = _port()
    t0 = time.perf_counter()
    proc = start(port)
    try:
        ready, first = first_token(port, proc, prompt, poll, before)
        spawn = time.perf_counter() - t0 - first  # Popen itself, before the clock above
        if after is not None:
            with httpx.Client(timeout=120) as http:
                after(http, f"http://127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGTERM)  # llamaserve saves its cached sequences here
        proc.wait(60)
    return ready + spawn, first + spawn


def llamaserve(args: argparse.Namespace, cache: Path, tmp: Path) -> Start:
    cfg = {"server": {"log_level": "info" if args.log else "warning"},
           "disk_cache": {"path": str(cache)},
           "model": {"path": args.model, "alias": "bench", "n_ctx": args.n_ctx,
                     "n_seq_max": args.n_seq, "threads": args.threads,
                     "threads_batch": args.threads}}
    path = tmp / "cold_start.json"
    path.write_text(json.dumps(cfg))
    return lambda port: subprocess.Popen(
        [sys.executable, str(ROOT / "server.py"), "-C", str(path), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=log_file(args))


def llama_server(args: argparse.Namespace, slots: Path | None) -> Start:
    extra = ["--slot-save-path", f"{slots}/"] if slots is not None else []
    return lambda port: subprocess.Popen(
        [args.llama_server, "-m", args.model, "--port", str(port), "-np", str(args.n_seq),
         "-c", str(args.n_ctx * args.n_seq), "-t", str(args.threads), "-tb",
         str(args.threads), "--no-webui", *extra],
        stdout=subprocess.DEVNULL, stderr=log_file(args))


def log_file(args: argparse.Namespace) -> int | IO[bytes]:
    """Where a server's stderr goes: appended to ``--log`` (with the spawn time), or nowhere."""
    if not args.log:
        return subprocess.DEVNULL
    f = open(args.log, "ab")  # noqa: SIM115 - the child keeps it
    f.write(f"=== spawn {time.time():.3f}\n".encode())
    f.flush()
    return f


def dump_metrics(log: str) -> Hook:
    """After the first token: llamaserve's engine and cache metrics, into the log."""
    def hook(http: httpx.Client, url: str) -> None:
        lines = [x for x in http.get(f"{url}/metrics").text.splitlines()
                 if x.startswith(("llamaserve_engine_step_seconds_", "llamaserve_disk",
                                  "llamaserve_prompt_tokens", "llamaserve_queue"))]
        with open(log, "a") as f:
            f.write(f"=== first token {time.time():.3f}\n" + "\n".join(lines) + "\n")
    return hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--model", default=str(model_path("qwen-0.5b")))
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--poll", type=float, default=0.02, help="seconds between /health polls")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-seq", type=int, default=4)
    ap.add_argument("--n-ctx", type=int, default=4096, help="per sequence")
    ap.add_argument("--log", default="", help="append the servers' stderr to this file")
    args = ap.parse_args()
    from llama_cpp import Llama

    vocab = Llama(args.model, vocab_only=True, verbose=False)
    with open(args.model, "rb") as f:  # every run finds the file in the page cache
        while f.read(1 << 24):
            pass
    runs: dict[str, list[tuple[float, float]]] = {}
    for k in range(args.repeats):
        prompt = long_prompt(lambda t: len(vocab.tokenize(t.encode(), add_bos=False)),
                             args.prompt_tokens, 100 + k)
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            if args.llama_server:
                runs.setdefault("llama-server cold", []).append(
                    timed(llama_server(args, None), prompt, args.poll))
                slots = tmp / "slots"
                slots.mkdir()

                def slot(action: str) -> Hook:
                    return lambda http, url: http.post(
                        f"{url}/slots/0?action={action}",
                        json={"filename": "bench.bin"}).raise_for_status()

                timed(llama_server(args, slots), prompt, args.poll, after=slot("save"))
                runs.setdefault("llama-server warm (slot file)", []).append(
                    timed(llama_server(args, slots), prompt, args.poll, before=slot("restore")))
            cache = tmp / "disk_cache"
            start = llamaserve(args, cache, tmp)
            after = dump_metrics(args.log) if args.log else None
            runs.setdefault("llamaserve cold", []).append(
                timed(start, prompt, args.poll, after=after))
            runs.setdefault("llamaserve warm (disk_cache)", []).append(
                timed(start, prompt, args.poll, after=after))
            shutil.rmtree(cache, ignore_errors=True)
        for name, values in runs.items():
            print(f"{name}: {values[-1]}", file=sys.stderr)
    medians = {name: (statistics.median(r for r, _ in v), statistics.median(f for _, f in v))
               for name, v in runs.items()}
    cold = medians["llamaserve cold"][1]
    ref = medians.get("llama-server cold", (0.0, 0.0))[1]
    rows: list[dict[str, object]] = []
    for name, (ready, first) in medians.items():
        rows.append({"run": name, "ready s": round(ready, 2), "first token s": round(first, 2),
                     "/ llamaserve cold": round(first / cold, 3),
                     "/ llama-server cold": round(first / ref, 3) if ref else ""})
    report(rows, "cold_start", Chart("run", ["ready s", "first token s"], "seconds",
                                     f"Process start to first token, {args.prompt_tokens}-"
                                     "token prompt"))


if __name__ == "__main__":
    main()
