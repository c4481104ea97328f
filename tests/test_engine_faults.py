"""Failures inside the engine: a failing step fails only its requests; a dead engine
thread makes /healthz say 503. In-process, on the real Gemma model."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from websockets.sync.client import connect as ws_connect

from api.web.app import build_app
from conftest import ROOT, free_port, gemma_config
from engine.config import parse
from engine.core import Engine
from engine.handle import ModelHandle
from engine.runner import Runner


@pytest.fixture()
def app_client() -> Iterator[tuple[TestClient, Engine]]:
    config = parse(gemma_config(n_seq_max=4, n_ctx=1024))
    assert config.model.path is not None
    engine = Engine(Runner(config.model.path, config.model), config.model)
    with TestClient(build_app(config, ModelHandle(engine)),
                    raise_server_exceptions=False) as client:
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


def test_engine_death_in_a_real_process_fails_in_flight_requests_and_exits_1(
        tmp_path: Path) -> None:
    """A stream and a WebSocket response in flight end with error objects at once,
    /healthz turns 503, new requests get 503, and the process exits with status 1 (for a
    supervisor's Restart=on-failure) after server.engine_failure_exit seconds."""
    trigger = tmp_path / "kill-engine"
    cfg = gemma_config(n_seq_max=4)
    cfg["server"]["engine_failure_exit"] = 3
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps(cfg))
    port = free_port()
    log = (tmp_path / "log").open("wb")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "faulty_server.py"), "-C",
                             str(cfg_path), "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT,
                            env={**os.environ, "LLAMASERVE_KILL_ENGINE": str(trigger)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        long = {"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
        with ws_connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
            ws.send(json.dumps({"type": "response.create", "input": "Count to 500.",
                                "max_output_tokens": 2000}))
            with httpx.stream("POST", f"{url}/v1/completions", json={**long, "stream": True},
                              timeout=60) as r:
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data:"))
                assert '"text"' in first
                killed = time.monotonic()
                trigger.touch()
                rest = [line for line in lines if line.startswith("data:")]
            assert time.monotonic() - killed < 5  # failed fast, not at max_tokens
            assert any('"error"' in line and "engine thread died" in line for line in rest)
            events = []
            while not events or events[-1]["type"] not in ("response.failed", "error"):
                events.append(json.loads(ws.recv(timeout=10)))
            assert events[-1]["type"] in ("response.failed", "error")
        health = httpx.get(f"{url}/healthz", timeout=10)
        assert health.status_code == 503 and "injected" in health.json()["reason"]
        r2 = httpx.post(f"{url}/v1/completions", json=BODY, timeout=10)
        assert r2.status_code == 503 and r2.json()["error"]["code"] == "engine_unavailable"
        assert proc.wait(30) == 1
        assert "llamaserve: engine failed:" in (tmp_path / "log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
