"""Generated request bodies never get a 5xx, and the server stays healthy (short run; the
long one is bench/fuzz.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from websockets.sync.client import connect

from conftest import ServerProcess, gemma_config, start_server
from fuzz_bodies import (
    CHATML,
    check_error_shape,
    hostile_bodies,
    post,
    post_raw,
    request_bodies,
    ws_exchange,
    ws_frames,
)

EXAMPLES = 300
HOSTILE_EXAMPLES = 300
WS_EXAMPLES = 80


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # a chat template, so chat, Responses and Anthropic bodies run all the way through
    cfg = gemma_config(max_output_tokens=4, n_seq_max=4, embedding=True,
                       chat_template=CHATML)
    cfg["server"]["max_body_bytes"] = 65536
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
        check_error_shape(r)

    check()
    assert sum(statuses.values()) >= EXAMPLES
    # both accepted and refused bodies were exercised (the same examples every run)
    assert statuses.get(200, 0) >= 3 and sum(v for k, v in statuses.items() if k >= 400) > 10
    assert http.get("/healthz").status_code == 200
    m = fuzz_server.metrics()
    assert m["llamaserve_requests_running"] == 0 and m["llamaserve_engine_alive"] == 1


def test_hostile_bodies_get_a_4xx_error_object_and_no_connection_drops(
        fuzz_server: ServerProcess, http: httpx.Client) -> None:
    """Deep nesting, surrogates / NUL / non-BMP text in values and keys, huge and
    non-finite numbers, every numeric field at its type boundaries, duplicated keys,
    invalid UTF-8, long strings and arrays."""
    statuses: dict[int, int] = {}
    dropped: list[bytes] = []

    @settings(max_examples=HOSTILE_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(hostile_bodies())
    def check(case: tuple[str, bytes]) -> None:
        r = post_raw(http, case)
        if r is None:
            dropped.append(case[1][:200])
            return
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        check_error_shape(r)

    check()
    assert not dropped, dropped[:3]
    assert statuses.get(400, 0) > 50 and statuses.get(200, 0) > 5, statuses
    assert http.get("/healthz").status_code == 200
    m = fuzz_server.metrics()
    assert m["llamaserve_requests_running"] == 0 and m["llamaserve_engine_alive"] == 1


def test_websocket_frames_get_an_answer_on_a_socket_that_stays_usable(
        fuzz_server: ServerProcess) -> None:
    """Text and binary frames, hostile bodies, junk bytes, frames past max_body_bytes and
    a second response.create while one is in flight, all on ONE connection: every frame
    is answered (an error event or a terminal response event) and the socket stays open."""
    seen: dict[str, int] = {}
    with connect(f"ws://127.0.0.1:{fuzz_server.port}/v1/responses",
                 max_size=None) as ws:

        @settings(max_examples=WS_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(ws_frames())
        def check(case: tuple[str, str | bytes]) -> None:
            kind, frame = case
            for outcome in ws_exchange(ws, kind, frame):
                seen[outcome] = seen.get(outcome, 0) + 1
                if outcome.startswith("error:"):
                    assert int(outcome.rsplit(":", 1)[1]) < 500, (kind, frame[:200], outcome)

        check()
        # still usable after everything
        assert ws_exchange(ws, "valid", '{"type": "response.create", "input": "Hi", '
                           '"max_output_tokens": 2}')[0].startswith("response.")
    assert any(k.startswith("response.") for k in seen), seen
    assert seen.get("error:request_too_large:413", 0) > 0, seen
    assert any(k.startswith("error:response_in_progress") for k in seen), seen
    assert http_health(fuzz_server) == 200


def http_health(server: ServerProcess) -> int:
    return httpx.get(f"{server.url}/healthz", timeout=10).status_code
