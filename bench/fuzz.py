"""The long fuzz: thousands of generated request bodies and WebSocket frames against a real
server (Gemma 3 270M, n_seq_max 4, max_body_bytes 64 KiB, a random vision + audio
projector and two LoRA adapters: ``fuzz_bodies.fuzz_config``, the same server as
tests/test_fuzz.py).

Same strategies as tests/test_fuzz.py (tests/fuzz_bodies.py): near-valid bodies, media and
LoRA bodies (data: / http(s) / file: URLs, corrupt and bomb-like images and audio, every
shape of ``lora``) and hostile ones (deep nesting, surrogates, huge numbers, duplicate
keys, bad UTF-8, ...), then hostile JSON Schemas in every place a request carries one
(tests/fuzz_schemas.py: huge counts, enums, $ref chains, patterns...; drawn afresh on each
run, unlike the test's fixed examples), then WebSocket frames on one connection. Prints statuses per
endpoint and dropped connections; fails (exit 1) on any 5xx, any dropped connection, any
unanswered frame, an unhealthy server afterwards, or an image request that no longer
works.

    flock /tmp/llamaserve-bench.lock python bench/fuzz.py --examples 10000 --ws-examples 1000 \
        --schema-examples 1000
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import media_samples  # noqa: E402
from conftest import start_server  # noqa: E402
from fuzz_bodies import (  # noqa: E402
    any_bodies,
    check_error_shape,
    fuzz_config,
    post,
    post_raw,
    ws_exchange,
    ws_frames,
)
from fuzz_schemas import schema_cases  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10000)
    ap.add_argument("--ws-examples", type=int, default=1000)
    ap.add_argument("--schema-examples", type=int, default=1000)
    args = ap.parse_args()
    counts: Counter[tuple[str, int]] = Counter()
    dropped: Counter[str] = Counter()
    ws_seen: Counter[str] = Counter()
    failures: list[tuple[str, Any, str]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(fuzz_config(Path(tmp)), Path(tmp))
        try:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                @settings(max_examples=args.examples, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                @given(any_bodies())
                def check(case: tuple[str, bytes]) -> None:
                    path, raw = case
                    r = post_raw(http, case)
                    if r is None:
                        dropped[path] += 1
                        failures.append((path, raw[:200], "dropped"))
                        return
                    counts[(path, r.status_code)] += 1
                    if r.status_code >= 500:
                        failures.append((path, raw[:200], r.text[:300]))
                        return
                    try:  # OpenAI's shape, Anthropic's on /v1/messages
                        check_error_shape(r)
                    except (AssertionError, ValueError):
                        failures.append((path, raw[:200], "bad error shape " + r.text[:200]))

                check()

                @settings(max_examples=args.schema_examples, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                @given(schema_cases())
                def check_schema(case: tuple[str, Any]) -> None:
                    path = f"{case[0]} (schema)"
                    try:
                        r = post(http, case)
                    except httpx.HTTPError as exc:
                        dropped[path] += 1
                        failures.append((path, str(case[1])[:200], f"dropped: {exc}"))
                        return
                    counts[(path, r.status_code)] += 1
                    if r.status_code >= 500:
                        failures.append((path, str(case[1])[:200], r.text[:300]))

                check_schema()
                http_seconds = time.monotonic() - started
                ws_url = f"ws://127.0.0.1:{server.port}/v1/responses"
                ws = connect(ws_url, max_size=None)

                @settings(max_examples=args.ws_examples, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                @given(ws_frames())
                def check_ws(case: tuple[str, str | bytes]) -> None:
                    nonlocal ws
                    kind, frame = case
                    try:
                        seen = ws_exchange(ws, kind, frame)
                    except Exception as exc:
                        ws_seen["dropped"] += 1
                        failures.append(("ws", frame[:200], f"{type(exc).__name__}: {exc}"))
                        ws = connect(ws_url, max_size=None)
                        return
                    for outcome in seen:
                        ws_seen[outcome] += 1
                        if outcome.startswith("error:") and int(outcome.rsplit(":", 1)[1]) >= 500:
                            failures.append(("ws", frame[:200], outcome))

                check_ws()
                ws.close()
                healthy = http.get("/healthz").status_code == 200
                image = base64.b64encode(media_samples.png(9, 9)).decode()
                media_ok = http.post("/v1/chat/completions", json={
                    "max_tokens": 2, "messages": [{"role": "user", "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {
                            "url": f"data:image/png;base64,{image}"}}]}]}).status_code == 200
                m = server.metrics()
                running = m["llamaserve_requests_running"]
                alive = m["llamaserve_engine_alive"]
        finally:
            server.stop()
    total = sum(counts.values()) + sum(dropped.values())
    print(f"HTTP: {total} bodies in {http_seconds:.0f} s; dropped connections: "
          f"{sum(dropped.values())}; 5xx: {sum(n for (_, s), n in counts.items() if s >= 500)}")
    for (path, status), n in sorted(counts.items()):
        print(f"  {path:24} {status}  {n}")
    print(f"WebSocket: {sum(ws_seen.values())} replies on one connection "
          f"(dropped/unanswered: {ws_seen['dropped']})")
    for outcome, n in sorted(ws_seen.items()):
        print(f"  {outcome:48} {n}")
    print(f"healthy afterwards: {healthy}; an image request works: {media_ok}; engine alive: "
          f"{alive:g}; sequences running: {running:g}; total {time.monotonic() - started:.0f} s")
    for path, body, text in failures[:10]:
        print("FAIL:", path, repr(body)[:200], text)
    return 0 if not failures and healthy and media_ok and running == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
