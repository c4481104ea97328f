"""Auth, CORS, limits, timeouts, metrics, logs and draining, on real servers (Gemma 3 270M)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from conftest import ServerProcess, gemma_config, qwen_config, start_server

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """API key from an environment variable, /metrics protected, CORS for one origin,
    3 requests per minute per key, a small body limit, and an access log file."""
    tmp = tmp_path_factory.mktemp("guarded")
    cfg = gemma_config()
    cfg["server"] = {"api_key_env": "LLAMASERVE_TEST_KEY", "metrics_auth": True,
                     "rate_limit": 30, "max_body_bytes": 4096,
                     "log_file": str(tmp / "access.log"),
                     "cors": {"allow_origins": ["https://app.example"]}}
    server = start_server(cfg, tmp, env={"LLAMASERVE_TEST_KEY": KEY})
    yield server
    server.stop()


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_api_key_is_required_and_checked(guarded: ServerProcess) -> None:
    url = f"{guarded.base_url}/models"
    for headers in ({}, auth("wrong"), {"Authorization": "Basic abc"}):
        r = httpx.get(url, headers=headers, timeout=10)
        assert r.status_code == 401
        error = r.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        assert set(error) == {"message", "type", "param", "code"}
    assert httpx.get(url, headers=auth(), timeout=10).status_code == 200
    assert httpx.get(f"{guarded.url}/healthz", timeout=10).status_code == 200  # public
    assert httpx.get(f"{guarded.url}/metrics", timeout=10).status_code == 401  # metrics_auth
    assert httpx.get(f"{guarded.url}/metrics", headers=auth(), timeout=10).status_code == 200
    with pytest.raises(InvalidStatus) as err:
        connect(f"ws://127.0.0.1:{guarded.port}/v1/responses").close()
    assert err.value.response.status_code == 401
    with connect(f"ws://127.0.0.1:{guarded.port}/v1/responses",
                 additional_headers=auth()) as ws:
        ws.send("{}")
        assert json.loads(ws.recv())["type"] == "error"


def test_cors_preflight(guarded: ServerProcess) -> None:
    headers = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization,content-type"}
    r = httpx.options(f"{guarded.base_url}/chat/completions", headers=headers, timeout=10)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    bad = httpx.options(f"{guarded.base_url}/chat/completions", timeout=10,
                        headers={**headers, "Origin": "https://evil.example"})
    assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers


def test_body_over_the_limit_is_413(guarded: ServerProcess) -> None:
    r = httpx.post(f"{guarded.base_url}/completions", headers=auth(), timeout=10,
                   json={"prompt": "x" * 5000, "max_tokens": 1})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


def test_access_log_and_metrics(guarded: ServerProcess, tmp_path: Path) -> None:
    before = guarded_metrics(guarded)
    r = httpx.post(f"{guarded.base_url}/completions", headers=auth(), timeout=30,
                   json={"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200
    after = guarded_metrics(guarded)
    ok = "llamaserve_http_requests_total{route=/v1/completions,status=200}"
    assert after[ok] == before.get(ok, 0) + 1
    for name in ("llamaserve_time_to_first_token_seconds_count", "llamaserve_queue_seconds_count",
                 "llamaserve_request_seconds_count", "llamaserve_inter_token_seconds_count",
                 "llamaserve_engine_batch_tokens_count", "llamaserve_generated_tokens_total"):
        assert after[name] > before.get(name, 0), name
    assert after["llamaserve_http_errors_total{type=authentication_error}"] >= 1
    log = (Path(guarded.log_path).parent / "access.log").read_text()
    line = next(ln for ln in log.splitlines() if '"POST /v1/completions" 200' in ln)
    assert "model=gemma-3-270m prompt_tokens=5 completion_tokens=5" in line
    assert "Once upon" not in log  # no prompt text in logs


def guarded_metrics(server: ServerProcess) -> dict[str, float]:
    return server.metrics(headers=auth())


def test_rate_limit_per_key(tmp_path: Path) -> None:
    cfg = gemma_config()
    cfg["server"] = {"api_keys": [KEY, "sk-other"], "rate_limit": 3}
    server = start_server(cfg, tmp_path)
    try:
        url = f"{server.base_url}/models"
        assert [httpx.get(url, headers=auth(), timeout=10).status_code
                for _ in range(4)] == [200, 200, 200, 429]
        r = httpx.get(url, headers=auth(), timeout=10)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert httpx.get(url, headers=auth("sk-other"), timeout=10).status_code == 200
    finally:
        server.stop()


def test_queue_overflow_is_429_and_timeouts_free_sequences(tmp_path: Path) -> None:
    cfg = gemma_config(n_seq_max=1)
    cfg["server"] = {"max_queue": 0, "request_timeout": 1.5}
    server = start_server(cfg, tmp_path)
    try:
        url = f"{server.base_url}/completions"
        long = {"prompt": "Count:", "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
        results: dict[str, Any] = {}

        def run() -> None:
            results["long"] = httpx.post(url, json=long, timeout=60).json()

        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(0.5)  # the long request holds the only sequence
        r = httpx.post(url, json={"prompt": "x", "max_tokens": 1}, timeout=10)
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        assert r.headers["retry-after"] == "1"
        worker.join(30)
        # cut by request_timeout after its first tokens: "length", flagged
        body = results["long"]
        assert body["choices"][0]["finish_reason"] == "length" and body["timed_out"] is True
        assert 0 < body["usage"]["completion_tokens"] < 1000
        # timed out before the first token (a prompt too long to prefill in time): 408
        slow = httpx.post(url, json={"prompt": "word " * 3500, "max_tokens": 5}, timeout=60)
        assert slow.status_code == 408 and slow.json()["error"]["code"] == "request_timeout"
        m = server.metrics()
        assert m["llamaserve_requests_running"] == 0 and m["llamaserve_requests_waiting"] == 0
        assert m["llamaserve_request_timeouts_total"] == 2
    finally:
        server.stop()


def test_sigterm_drains_in_flight_stream_then_exits_0(tmp_path: Path) -> None:
    server = start_server(gemma_config(), tmp_path)
    try:
        body = {"prompt": "Count:", "max_tokens": 120, "ignore_eos": True, "temperature": 0,
                "stream": True}
        texts: list[str] = []
        finish = None
        health_during: list[int] = []
        with httpx.stream("POST", f"{server.base_url}/completions", json=body,
                          timeout=60) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    texts.append(json.loads(line[6:])["choices"][0]["text"])
                    break
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            health_during.append(httpx.get(f"{server.url}/healthz", timeout=5).status_code)
            refused = httpx.post(f"{server.base_url}/completions", timeout=5,
                                 json={"prompt": "x", "max_tokens": 1})
            for line in lines:
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])["choices"][0]
                    texts.append(chunk["text"])
                    finish = chunk["finish_reason"] or finish
        assert finish == "length" and len(texts) >= 100  # the stream ran to its end
        assert health_during == [503]
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert server.proc.wait(30) == 0
    finally:
        server.stop()


def test_non_loopback_without_key_warns(tmp_path: Path) -> None:
    cfg = gemma_config()
    cfg["server"] = {"host": "0.0.0.0"}
    server = start_server(cfg, tmp_path)
    try:
        assert "without an API key" in server.log()
    finally:
        server.stop()


def test_healthz_is_503_loading_until_the_model_is_ready(tmp_path: Path) -> None:
    server = start_server(qwen_config(), tmp_path, wait=False)
    try:
        seen: list[tuple[int, Any]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{server.url}/healthz", timeout=10)
            except httpx.HTTPError:
                time.sleep(0.01)
                continue
            seen.append((r.status_code, r.json()))
            if r.status_code == 200:
                break
            api = httpx.post(f"{server.base_url}/completions", timeout=30,
                             json={"prompt": "x", "max_tokens": 1})
            if api.status_code == 503:
                assert api.json()["error"]["code"] == "loading"
            time.sleep(0.01)
        assert seen[-1][0] == 200
        assert all(body == {"status": "loading"} for status, body in seen[:-1])
        assert all(status == 503 for status, _ in seen[:-1])
        assert len(seen) > 1, "the port opened only after the model was loaded"
    finally:
        server.stop()


def test_sigusr1_drains_and_exits_0(tmp_path: Path) -> None:
    server = start_server(gemma_config(), tmp_path)
    try:
        body = {"prompt": "Count:", "max_tokens": 60, "ignore_eos": True, "temperature": 0}
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.update(httpx.post(
            f"{server.base_url}/completions", json=body, timeout=60).json()))
        worker.start()
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGUSR1)
        worker.join(60)
        assert result["choices"][0]["finish_reason"] == "length"
        assert result["usage"]["completion_tokens"] == 60
        assert server.proc.wait(30) == 0
    finally:
        server.stop()


def test_native_crash_writes_every_threads_python_stack_to_the_log(tmp_path: Path) -> None:
    """A segfault inside native code (here delivered as SIGSEGV mid-stream, as llama.cpp
    would raise it) leaves the Python stack of every thread in the log file, the engine
    thread's inside its step, before the process dies with the signal for its supervisor
    to restart it."""
    cfg = gemma_config()
    cfg["server"] = {"log_file": str(tmp_path / "llamaserve.log")}
    server = start_server(cfg, tmp_path)
    try:
        body = {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/completions", json=body,
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break  # the engine thread is generating
            server.proc.send_signal(signal.SIGSEGV)
            assert server.proc.wait(30) == -signal.SIGSEGV
        log = (tmp_path / "llamaserve.log").read_text()
        assert "Fatal Python error: Segmentation fault" in log, log[-2000:]
        assert log.count("Thread 0x") >= 2 and "engine/core.py" in log, log[-3000:]
    finally:
        server.stop()
