"""llamaserve against llama-server where decoding is cheap, as on a GPU: each server's own
cost per step becomes the throughput.

Writes the tiny random-weight llama of tests/make_tiny_model.py (SmolLM2's real tokenizer and
template; ``llama_decode`` well under a millisecond per token here), then starts each
server in turn on it (never both at once; same threads, 64 sequences, each server's other
defaults) and drives it with bench/light_client.py in its own process at each concurrency,
streaming and not: exactly ``--tokens`` tokens per request (``ignore_eos``), default
sampling. Prints tokens/s, TTFT p50 and ITL p50 / p99 per server and the ratio
llamaserve / llama-server, plus the client's CPU share (a client near 100% of a core would
be the bottleneck: the row says so) and the server's own CPU time per generated token
(user + system, all its threads, from /proc): the cost that wall-clock figures hide when
other work shares the machine; and its memory: the resident set once warmed up and idle,
and the peak above it during each level, per sequence.

    python bench/step_overhead.py --llama-server /tmp/llama-build/bin/llama-server
    python bench/step_overhead.py --model ~/.cache/llamaserve/gemma-3-270m-q4_k_m.gguf \\
        --concurrency 1,4,16 --llama-server ...

llama-server's build: see bench/compare_servers.py. Writes bench/results/step_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from make_tiny_model import write_tiny_model  # noqa: E402

from compare_servers import _port, _wait  # noqa: E402
from report import report  # noqa: E402

N_SEQ = 64


def start_llamaserve(model: str, threads: int, ctx: int, tmp: Path,
                     extra: dict[str, Any] | None = None,
                     env: dict[str, str] | None = None, root: Path = ROOT) -> tuple[Any, int]:
    """llamaserve on ``model``; ``root``: the checkout whose server.py runs."""
    port = _port()
    cfg = {"server": {"host": "127.0.0.1", "port": port, "log_level": "warning",
                      "max_queue": 1024},
           "model": {"path": model, "alias": "tiny", "n_ctx": ctx, "n_seq_max": N_SEQ,
                     "threads": threads, "threads_batch": threads, **(extra or {})}}
    path = tmp / f"llamaserve-{port}.json"
    path.write_text(json.dumps(cfg))
    log = (tmp / f"llamaserve-{port}.log").open("wb")
    proc = subprocess.Popen([sys.executable, str(root / "server.py"), "-C", str(path)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=root,
                            env={**os.environ, **(env or {})})
    _wait(f"http://127.0.0.1:{port}/healthz", proc)
    return proc, port


def start_llama_server(binary: str, model: str, threads: int, ctx: int, tmp: Path,
                       flags: list[str] | None = None) -> tuple[Any, int]:
    port = _port()
    log = (tmp / f"llama-server-{port}.log").open("wb")
    proc = subprocess.Popen([binary, "-m", model, "--port", str(port), "--host", "127.0.0.1",
                             "-np", str(N_SEQ), "-c", str(ctx), "-t", str(threads),
                             "-tb", str(threads), "--log-disable", *(flags or [])],
                            stdout=log, stderr=subprocess.STDOUT)
    _wait(f"http://127.0.0.1:{port}/health", proc)
    return proc, port


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(port: int, concurrency: int, tokens: int, requests: int, stream: bool
          ) -> dict[str, float]:
    cmd = [sys.executable, str(ROOT / "bench" / "light_client.py"), "--port", str(port),
           "--concurrency", str(concurrency), "--tokens", str(tokens),
           "--requests", str(requests)] + (["--stream"] if stream else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
    return dict(json.loads(done.stdout))


def rss_mib(pid: int) -> float:
    """Resident set of a process (``VmRSS``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class PeakRss:
    """The highest resident set of ``pid`` while the block runs, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mib(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def level(name: str, pid: int, port: int, idle: float, mode: str, c: int, tokens: int,
          budget: int) -> dict[str, Any]:
    """One level on one server: about ``budget`` tokens at ``c`` concurrent requests."""
    requests = max(2, budget // (c * tokens))
    cpu = cpu_seconds(pid)
    with PeakRss(pid) as rss:
        r = drive(port, c, tokens, requests, mode == "stream")
    cpu = cpu_seconds(pid) - cpu
    row = {"server": name, "mode": mode, "c": c, "tok/s": round(r["tok_s"], 1),
           "TTFT p50 ms": round(r["ttft_p50"] * 1000, 1),
           "ITL p50 ms": round(r["itl_p50"] * 1000, 2),
           "ITL p99 ms": round(r["itl_p99"] * 1000, 2),
           "server CPU ms/token": round(cpu * 1000 / max(1, r["tokens"]), 3),
           "client CPU": f"{r['client_cpu_share']:.0%}",
           "RSS idle MiB": round(idle, 1),
           "RSS per sequence KiB": round(max(0.0, rss.peak - idle) * 1024 / c),
           "errors": int(r["errors"])}
    print(row, file=sys.stderr, flush=True)
    return row


def warm(pid: int, port: int) -> float:
    """Warm a server up; its resident set, idle, afterwards."""
    drive(port, 4, 16, 1, True)
    time.sleep(0.5)
    return rss_mib(pid)


def measure(name: str, pid: int, port: int, levels: list[int], tokens: int, modes: list[str],
            budget: int) -> list[dict[str, Any]]:
    idle = warm(pid, port)
    return [level(name, pid, port, idle, mode, c, tokens, budget)
            for mode in modes for c in levels]


def interleaved(servers: dict[str, tuple[Any, int]], levels: list[int], tokens: int,
                modes: list[str], budget: int, rounds: int) -> list[dict[str, Any]]:
    """Every level on each server in turn, ``rounds`` times; each server's median round
    (by tokens/s), with every round's tokens/s beside it ("tok/s rounds").
    This machine's speed moves by up to 2x within minutes: a cell measured on both servers
    within seconds of each other, several times, compares them; whole runs one after the
    other do not."""
    idle = {name: warm(proc.pid, port) for name, (proc, port) in servers.items()}
    rows = []
    for mode in modes:
        for c in levels:
            seen: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
            for _ in range(rounds):
                for name, (proc, port) in servers.items():
                    seen[name].append(level(name, proc.pid, port, idle[name], mode, c,
                                            tokens, budget))
            for got in seen.values():
                middle = sorted(got, key=lambda r: r["tok/s"])[len(got) // 2]
                rows.append({**middle, "tok/s rounds": [r["tok/s"] for r in got]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", default="/tmp/llama-build/bin/llama-server")
    ap.add_argument("--model", default=None, help="default: the tiny model (written if missing)")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--modes", default="stream,nostream")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16384, help="tokens generated per level")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--servers", default="llamaserve,llama-server")
    ap.add_argument("--rounds", type=int, default=0,
                    help="both servers up at once, each level on each in turn this many times "
                         "(the median round kept, every round's ratio shown); 0: one server "
                         "after the other")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                    help="a model config field for llamaserve, e.g. kv_unified=false")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE",
                    help="one more llamaserve, named NAME, with an environment variable "
                         "set, e.g. passive:OMP_WAIT_POLICY=PASSIVE, or a model config field "
                         "(model.FIELD=JSON, e.g. bs:model.backend_sampling=true); added "
                         "to --servers. A server named llama-server-bs in --servers is "
                         "llama-server with --backend-sampling")
    args = ap.parse_args()
    model = args.model or str(write_tiny_model())
    levels = [int(c) for c in args.concurrency.split(",")]
    modes = args.modes.split(",")
    ctx = N_SEQ * (args.tokens + 64)
    extra = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    envs: dict[str, dict[str, str]] = {name: {} for name in args.servers.split(",")}
    fields: dict[str, dict[str, Any]] = {}
    for item in args.variant:
        name, setting = item.split(":", 1)
        var, value = setting.split("=", 1)
        envs.setdefault(name, {})
        if var.startswith("model."):
            fields.setdefault(name, {})[var.removeprefix("model.")] = json.loads(value)
        else:
            envs[name][var] = value

    def start(name: str, tmp: Path) -> tuple[Any, int]:
        if name.startswith("llama-server"):
            return start_llama_server(args.llama_server, model, args.threads, ctx, tmp,
                                      ["--backend-sampling"] if name.endswith("-bs") else [])
        return start_llamaserve(model, args.threads, ctx, tmp,
                                {**extra, **fields.get(name, {})}, envs[name])

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.rounds:
            servers: dict[str, tuple[Any, int]] = {}
            try:
                for name in envs:
                    servers[name] = start(name, Path(tmp))
                rows = interleaved(servers, levels, args.tokens, modes, args.budget,
                                   args.rounds)
            finally:
                for proc, _ in servers.values():
                    proc.terminate()
                    proc.wait(30)
        for name in envs if not args.rounds else []:
            proc, port = start(name, Path(tmp))
            try:
                rows += measure(name, proc.pid, port, levels, args.tokens, modes, args.budget)
            finally:
                proc.terminate()
                proc.wait(30)
                time.sleep(1)
    theirs = {(r["mode"], r["c"]): r for r in rows if r["server"] == "llama-server"}
    for r in [r for r in rows if r["server"] != "llama-server"]:
        key = (r["mode"], r["c"])
        if key in theirs and theirs[key]["tok/s"]:
            name = "ratio" if r["server"] == "llamaserve" else f"ratio {r['server']}"
            rows.append({"server": name, "mode": key[0], "c": key[1],
                         "tok/s": round(r["tok/s"] / theirs[key]["tok/s"], 2),
                         "TTFT p50 ms": round(r["TTFT p50 ms"] / theirs[key]["TTFT p50 ms"], 2)
                         if theirs[key]["TTFT p50 ms"] else "",
                         "ITL p50 ms": round(r["ITL p50 ms"] / theirs[key]["ITL p50 ms"], 2)
                         if theirs[key]["ITL p50 ms"] else "",
                         "ITL p99 ms": "",
                         "server CPU ms/token": round(r["server CPU ms/token"] / theirs[key][
                             "server CPU ms/token"], 2) if theirs[key]["server CPU ms/token"]
                         else "", "client CPU": "",
                         "RSS idle MiB": round(r["RSS idle MiB"] / theirs[key]["RSS idle MiB"], 2),
                         "RSS per sequence KiB": "", "errors": "",
                         "tok/s rounds": [round(a / b, 2) for a, b in zip(
                             r.get("tok/s rounds", []), theirs[key].get("tok/s rounds", []),
                             strict=False)]})
    report(rows, "step_overhead")


if __name__ == "__main__":
    main()
