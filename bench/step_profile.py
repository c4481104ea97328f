"""Where an engine step's time goes with 16 streams decoding: llama.cpp's decode, the
sampler chains (C, called per sequence), and everything else the engine thread does in
Python (scheduling, detokenizing, stop strings, metrics, publishing).

Starts llamaserve on Qwen2.5-Coder-0.5B with ``--streams`` sequences (16), runs that many
concurrent streams (short distinct prompts, ``ignore_eos``, sampled at temperature 0.8 and
then greedy), and while all of them decode records the server with py-spy (``pip install
py-spy``; needs ptrace, i.e. root or CAP_SYS_PTRACE). Samples of the engine thread are
bucketed by the innermost llamaserve frame. The issue's rule: Python overhead above 5% of a
step at 16 streams is a bug.

    flock /tmp/llamaserve-bench.lock python bench/step_profile.py

Prints the table and writes bench/results/step_profile.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from agents import engine_time  # noqa: E402

from compare_servers import _port, _wait  # noqa: E402
from fetch_models import model_path  # noqa: E402
from report import Chart, report  # noqa: E402

# innermost llamaserve function -> bucket; the first match walking from the leaf wins
BUCKETS = [
    ("_decode_tokens", "llama_decode (C)"),
    ("_decode_media", "llama_decode (C)"),
    ("sample", "sampler chain (C)"),
    ("logprob", "sampler chain (C)"),
]


def _frame(frame: str) -> tuple[str, str]:
    """``Class.method (path/file.py:line)`` -> (``method``, ``path/file.py``)."""
    name, _, where = frame.partition(" (")
    return name.rsplit(".", 1)[-1], where.rsplit(":", 1)[0]


def bucket(stack: list[str]) -> str:
    """``stack`` is outermost first; the innermost llamaserve frame names the bucket."""
    for frame in reversed(stack):
        func, path = _frame(frame)
        if not any(part in path for part in ("engine/", "api/", "core.py", "runner.py")):
            continue
        for name, label in BUCKETS:
            if func == name and path.endswith("runner.py"):
                return label
        return "Python: " + func
    return "Python: other"


def parse_raw(path: Path) -> Counter[str]:
    """py-spy's raw (collapsed) output, engine thread only -> samples per bucket."""
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack_text, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack_text.split(";")
        parsed = [_frame(f) for f in frames]
        if not any(func == "_run" and where.endswith("core.py") for func, where in parsed):
            continue
        if not any(func == "_step" for func, _ in parsed):
            counts["idle (waiting for work)"] += int(n)
            continue
        counts[bucket(frames[1:])] += int(n)
    return counts


def stream(url: str, n: int, tokens: int, temperature: float, started: threading.Event,
           stop: threading.Event, errors: list[str]) -> None:
    body = {"model": "bench", "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "temperature": temperature, "seed": n,
            "messages": [{"role": "user", "content": f"Story {n}: write about a lighthouse "
                          f"keeper number {n} and the sea."}]}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    started.set()
                if stop.is_set():
                    break  # closing the stream cancels the request
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")


def profile(url: str, pid: int, streams: int, temperature: float, seconds: float,
            tokens: int, out: Path) -> dict[str, object]:
    errors: list[str] = []
    firsts = [threading.Event() for _ in range(streams)]
    stop = threading.Event()
    threads = [threading.Thread(target=stream, args=(url, n, tokens, temperature, firsts[n],
                                                     stop, errors)) for n in range(streams)]
    for t in threads:
        t.start()
    for e in firsts:
        e.wait(300)
    time.sleep(1.0)  # every stream is past its prefill
    before = engine_time(url)
    subprocess.run(["py-spy", "record", "-p", str(pid), "-d", str(seconds), "-r", "250",
                    "--threads", "--format", "raw", "-o", str(out), "--nonblocking"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = engine_time(url)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[:3])
    counts = parse_raw(out)
    busy = sum(v for k, v in counts.items() if not k.startswith("idle"))
    steps = after.get("step_seconds_count", 0) - before.get("step_seconds_count", 0)
    step_s = after.get("step_seconds_sum", 0) - before.get("step_seconds_sum", 0)
    share = {k: v / max(busy, 1) for k, v in counts.most_common() if not k.startswith("idle")}
    python = sum(v for k, v in share.items() if k.startswith("Python"))
    return {"streams": streams, "temperature": temperature,
            "ms/step": round(1000 * step_s / max(steps, 1), 1),
            "llama_decode %": round(100 * share.get("llama_decode (C)", 0), 1),
            "sampler %": round(100 * share.get("sampler chain (C)", 0), 1),
            "Python %": round(100 * python, 1),
            "top Python": ", ".join(f"{k.removeprefix('Python: ')} {100 * v:.1f}%"
                                    for k, v in list(share.items())
                                    if k.startswith("Python"))[:80],
            "idle %": round(100 * counts.get("idle (waiting for work)", 0)
                            / max(sum(counts.values()), 1), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(model_path("qwen-0.5b")))
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=12)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        port = _port()
        cfg = {"server": {"log_level": "warning"},
               "model": {"path": args.model, "alias": "bench", "n_ctx": 16384,
                         "n_seq_max": args.streams, "threads": args.threads,
                         "threads_batch": args.threads}}
        (tmp / "cfg.json").write_text(json.dumps(cfg))
        proc = subprocess.Popen([sys.executable, str(ROOT / "server.py"), "-C",
                                 str(tmp / "cfg.json"), "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait(f"{url}/health", proc)
            # enough tokens that every stream decodes for the whole recording
            tokens = 900
            for temperature in (0.8, 0.0):
                rows.append(profile(url, proc.pid, args.streams, temperature, args.seconds,
                                    tokens, tmp / f"raw-{temperature}.txt"))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    report(rows, "step_profile", Chart("temperature", ["llama_decode %", "sampler %",
                                                       "Python %"], "% of engine step",
                                       f"Engine step at {args.streams} streams"))


if __name__ == "__main__":
    main()
