"""The long fuzz: thousands of generated request bodies against a real server.

Same strategies as tests/test_fuzz.py (tests/fuzz_bodies.py), many more examples.
Prints the status-code distribution per endpoint; fails (exit 1) on any 5xx or if the
server is not healthy afterwards.

    python bench/fuzz.py --examples 3000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import gemma_config, start_server  # noqa: E402
from fuzz_bodies import post, request_bodies  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=3000)
    args = ap.parse_args()
    counts: Counter[tuple[str, int]] = Counter()
    failures: list[tuple[str, Any, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(gemma_config(max_output_tokens=4, embedding=True), Path(tmp))
        try:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                @settings(max_examples=args.examples, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                @given(request_bodies())
                def check(case: tuple[str, Any]) -> None:
                    path, body = case
                    r = post(http, case)
                    counts[(path, r.status_code)] += 1
                    if r.status_code >= 500:
                        failures.append((path, body, r.text[:300]))

                check()
                healthy = http.get("/healthz").status_code == 200
                running = server.metrics()["llamaserve_requests_running"]
        finally:
            server.stop()
    total = sum(counts.values())
    print(f"{total} requests; healthy afterwards: {healthy}; sequences running: {running:g}")
    for (path, status), n in sorted(counts.items()):
        print(f"  {path:24} {status}  {n}")
    for path, body, text in failures[:10]:
        print("5xx:", path, json.dumps(body)[:200], text)
    return 0 if not failures and healthy and running == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
