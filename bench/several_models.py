"""What switching models costs a server with a ``models`` list (CPU, real models).

Two models (Qwen2.5-Coder-0.5B as "coder", Gemma 3 270M with a plain template as
"base") with ``server.max_loaded_models`` 1, so each request for the other model
unloads the loaded one. For a ~2,100-token prompt, time to first token (the first
token of text, not the role chunk):

- warm: the model is loaded and the prompt is in its prefix cache;
- reload, disk cache: the model was unloaded (its engine saved its cached sequences) and
  loads again, the prompt comes from the disk cache;
- reload, no disk cache: the same on a server without ``disk_cache``;
- cold: a model loaded for the first time, nothing cached.

    flock /tmp/llamaserve-bench.lock python bench/several_models.py

Prints the table and writes bench/results/several_models.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from conftest import ServerProcess, gemma_config, qwen_config, start_server  # noqa: E402
from report import Chart, report  # noqa: E402

SYSTEM = "You are a careful assistant. " + " ".join(
    f"Rule {i}: when asked about item {i * 7 % 97}, answer in one short sentence."
    for i in range(110))


def ttft(server: ServerProcess, model: str, question: str) -> float:
    """Seconds to the first streamed token of a chat completion."""
    started = time.perf_counter()
    body = {"model": model, "stream": True, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": question}]}
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body,
                      timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content") or choices[0].get("finish_reason"):
                    return time.perf_counter() - started
    raise RuntimeError("no token")


def config(tmp: Path, disk: bool, threads: int) -> dict[str, Any]:
    coder = {**qwen_config()["model"], "alias": "coder", "n_seq_max": 2, "threads": threads}
    base = {**gemma_config()["model"], "alias": "base", "n_seq_max": 2, "threads": threads,
            "chat_template": qwen_config()["model"].get("chat_template")
            or "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"}
    cfg: dict[str, Any] = {"server": {"max_loaded_models": 1}, "models": [coder, base]}
    if disk:
        cfg["disk_cache"] = {"path": str(tmp / "disk"), "min_tokens": 64}
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    results: dict[str, list[float]] = {"cold (first load)": [], "warm (loaded, cached)": [],
                                       "reload + disk cache": [], "reload, no disk cache": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for disk in (True, False):
            server = start_server(config(tmp / f"d{disk}", disk, args.threads), tmp)
            try:
                ttft(server, "base", "Hello?")  # base is loaded; coder is not
                for r in range(args.rounds):
                    question = "Which rule covers item 14?"
                    t = ttft(server, "coder", question)  # loads coder (unloads base)
                    if disk:
                        results["cold (first load)" if r == 0 else
                                "reload + disk cache"].append(t)
                    elif r > 0:
                        results["reload, no disk cache"].append(t)
                    if disk:
                        results["warm (loaded, cached)"].append(ttft(server, "coder", question))
                    ttft(server, "base", "Hello?")  # unloads coder
            finally:
                server.stop()
    cold = statistics.median(results["cold (first load)"])
    rows = [{"case": name, "TTFT s": round(statistics.median(v), 2),
             "runs": len(v), "vs cold": round(statistics.median(v) / cold, 2)}
            for name, v in results.items() if v]
    report(rows, "several_models", Chart("case", ["TTFT s"], "seconds"))


if __name__ == "__main__":
    main()
