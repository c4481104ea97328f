"""Generated request bodies never get a 5xx, and the server stays healthy (short run; the
long one is bench/fuzz.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import ServerProcess, gemma_config, start_server
from fuzz_bodies import post, request_bodies

EXAMPLES = 300


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    cfg = gemma_config(max_output_tokens=4, n_seq_max=4, embedding=True)
    server = start_server(cfg, tmp_path_factory.mktemp("fuzz"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(fuzz_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_server.url, timeout=60) as client:
        yield client


def test_generated_bodies_never_get_a_5xx(fuzz_server: ServerProcess,
                                          http: httpx.Client) -> None:
    statuses: dict[int, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(request_bodies())
    def check(case: tuple[str, Any]) -> None:
        r = post(http, case)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (case, r.text)
        if r.status_code >= 400:
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}

    check()
    assert sum(statuses.values()) >= EXAMPLES
    # both accepted and refused bodies were exercised (the same examples every run)
    assert statuses.get(200, 0) > 5 and sum(v for k, v in statuses.items() if k >= 400) > 10
    assert http.get("/healthz").status_code == 200
    m = fuzz_server.metrics()
    assert m["llamaserve_requests_running"] == 0 and m["llamaserve_engine_alive"] == 1
