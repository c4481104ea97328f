"""Turn 2 of an agent conversation: WebSocket with previous_response_id vs cold HTTP.

Turn 1 sends long instructions (~2,000 tokens) and a question over a WebSocket; turn 2
continues it with ``previous_response_id`` and only the new question, so the server
reuses the connection's KV prefix. The same turn 2 is then sent over HTTP to a freshly
started server with the whole history in ``input`` (cold). Reports the time from sending
to the first output text delta (and to the first event) for both, and the ratio
(target ≤ 0.3). Qwen2.5-Coder-0.5B-Instruct, 2 threads.

    python bench/responses_ws.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from compare_servers import _port, _wait  # noqa: E402
from fetch_models import model_path  # noqa: E402
from prefix_cache import start_llamaserve, system_prompt  # noqa: E402
from report import report  # noqa: E402

QUESTION_1 = "Which rule mentions comets? Answer in one sentence."
QUESTION_2 = "And which rule mentions violins? Answer in one sentence."


def timed_ws_turn(ws: object, body: dict[str, object]) -> tuple[float, float, dict[str, object]]:
    send, recv = ws.send, ws.recv  # type: ignore[attr-defined]
    start = time.perf_counter()
    send(json.dumps({"type": "response.create", **body}))
    first_event = first_text = 0.0
    while True:
        event = json.loads(recv())
        now = time.perf_counter() - start
        first_event = first_event or now
        if event["type"] == "response.output_text.delta" and not first_text:
            first_text = now
        if event["type"] in ("response.completed", "response.incomplete", "response.failed",
                             "error"):
            return first_event, first_text or now, event


def timed_http_turn(url: str, body: dict[str, object]) -> tuple[float, float]:
    start = time.perf_counter()
    first_event = first_text = 0.0
    with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True},
                      timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                now = time.perf_counter() - start
                first_event = first_event or now
                if line == "event: response.output_text.delta" and not first_text:
                    first_text = now
    return first_event, first_text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(model_path("qwen-0.5b")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--words", type=int, default=1450)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    ws_times: list[tuple[float, float]] = []
    http_times: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            instructions = system_prompt(args.words, f"agent-{round_}")
            common = {"model": "bench", "instructions": instructions, "temperature": 0,
                      "max_output_tokens": 40, "store": False}
            port = _port()
            proc = start_llamaserve(args.model, args.threads, port, Path(tmp),
                                    Path(tmp) / f"unused-{round_}")
            url = f"http://127.0.0.1:{port}"
            try:
                _wait(f"{url}/health", proc)
                with connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None) as ws:
                    _, _, done = timed_ws_turn(ws, {**common, "input": QUESTION_1})
                    turn1 = done["response"]  # type: ignore[index]
                    answer = "".join(part["text"] for item in turn1["output"]
                                     for part in item.get("content", []))
                    t2 = timed_ws_turn(ws, {**common, "input": QUESTION_2,
                                            "previous_response_id": turn1["id"]})
                    ws_times.append(t2[:2])
            finally:
                proc.terminate()
                proc.wait(60)
            port = _port()  # a fresh server: nothing cached
            proc = start_llamaserve(args.model, args.threads, port, Path(tmp),
                                    Path(tmp) / f"unused-cold-{round_}")
            url = f"http://127.0.0.1:{port}"
            try:
                _wait(f"{url}/health", proc)
                history = [{"role": "user", "content": QUESTION_1},
                           {"role": "assistant", "content": answer},
                           {"role": "user", "content": QUESTION_2}]
                http_times.append(timed_http_turn(url, {**common, "input": history}))
            finally:
                proc.terminate()
                proc.wait(60)
    ws_event = statistics.mean(t[0] for t in ws_times)
    ws_text = statistics.mean(t[1] for t in ws_times)
    http_event = statistics.mean(t[0] for t in http_times)
    http_text = statistics.mean(t[1] for t in http_times)
    report([
        {"turn 2": "WebSocket, previous_response_id", "first event ms": round(ws_event * 1000),
         "first text delta ms": round(ws_text * 1000)},
        {"turn 2": "HTTP cold, full history", "first event ms": round(http_event * 1000),
         "first text delta ms": round(http_text * 1000)},
        {"turn 2": "ratio", "first event ms": round(ws_event / http_event, 3),
         "first text delta ms": round(ws_text / http_text, 3)},
    ], "responses_ws")


if __name__ == "__main__":
    main()
