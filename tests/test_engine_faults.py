"""Failures inside the engine: a failing step fails only its requests; a dead engine
thread makes /healthz say 503. In-process, on the real Gemma model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from api.app import build_app
from conftest import gemma_config
from engine.config import parse
from engine.core import Engine
from engine.runner import Runner


@pytest.fixture()
def app_client() -> Iterator[tuple[TestClient, Engine]]:
    config = parse(gemma_config(n_seq_max=4, n_ctx=1024))
    assert config.model.path is not None
    engine = Engine(Runner(config.model.path, config.model), config.model)
    with TestClient(build_app(config, engine), raise_server_exceptions=False) as client:
        yield client, engine
    engine.runner.close()


BODY = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}


def fail_decode_call(engine: Engine, monkeypatch: pytest.MonkeyPatch, nth: int,
                     message: str) -> None:
    """Make the nth llama_decode of the engine raise; the others run for real."""
    real_decode = engine.runner.decode
    calls = {"n": 0}

    def flaky(items: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == nth:
            raise RuntimeError(message)
        return real_decode(items)

    monkeypatch.setattr(engine.runner, "decode", flaky)


def test_failing_step_fails_its_requests_and_the_engine_keeps_serving(
        app_client: tuple[TestClient, Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    client, engine = app_client
    good = client.post("/v1/completions", json=BODY).json()["choices"][0]["text"]
    fail_decode_call(engine, monkeypatch, 1, "injected decode failure")
    r = client.post("/v1/completions", json=BODY)
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "server_error" and "injected decode failure" in err["message"]
    # the next request is served normally, with the same answer
    r = client.post("/v1/completions", json=BODY)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == good
    assert client.get("/healthz").status_code == 200
    assert engine.scheduler.seqs_in_use == 0


def test_failure_mid_stream_ends_the_stream_with_an_error_event(
        app_client: tuple[TestClient, Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    client, engine = app_client
    fail_decode_call(engine, monkeypatch, 3, "boom mid-stream")
    with client.stream("POST", "/v1/completions", json={**BODY, "stream": True,
                                                         "max_tokens": 20}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert any('"error"' in line and "boom mid-stream" in line for line in lines)
    assert client.post("/v1/completions", json=BODY).status_code == 200


def test_dead_engine_thread_makes_health_503(app_client: tuple[TestClient, Engine],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    client, engine = app_client

    def broken() -> Any:
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(engine.scheduler, "schedule", broken)
    r = client.post("/v1/completions", json=BODY)
    assert r.status_code == 500
    health = client.get("/healthz")
    assert health.status_code == 503 and "scheduler bug" in health.json()["reason"]
    r = client.post("/v1/completions", json=BODY)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
