"""Slow and many clients on a real server (Gemma 3 270M): the connection cap answers the
excess with an error object, header and body deadlines cut slowloris clients, and a
streaming client that stops reading is cancelled once its buffered output reaches
server.max_buffered_steps while the others are served."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from conftest import ServerProcess, gemma_config, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    cfg = gemma_config(n_seq_max=4)
    cfg["server"].update(max_connections=6, header_timeout=1.5, body_timeout=2,
                         keep_alive_timeout=30, max_buffered_steps=16,
                         send_buffer_bytes=8192)
    srv = start_server(cfg, tmp_path_factory.mktemp("conn"))
    yield srv
    srv.stop()


def raw_connection(server: ServerProcess, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", server.port))
    s.settimeout(10)
    return s


def read_all(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except OSError:
        pass
    return out


def test_connections_past_the_cap_get_503_error_objects(server: ServerProcess) -> None:
    idle = [raw_connection(server) for _ in range(6)]
    try:
        time.sleep(0.2)
        r = httpx.get(f"{server.url}/healthz", timeout=10)
        assert r.status_code == 503 and r.headers["connection"] == "close"
        assert r.json()["error"]["code"] == "too_many_connections"
        with pytest.raises(InvalidStatus) as err:
            connect(f"ws://127.0.0.1:{server.port}/v1/responses").close()
        assert err.value.response.status_code == 503
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_idle_and_slow_header_connections_are_closed(server: ServerProcess) -> None:
    idle = raw_connection(server)
    slow = raw_connection(server)
    started = time.monotonic()
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    for i in range(len(request)):  # a byte every 0.1 s: never finishes within 1.5 s
        try:
            slow.send(request[i:i + 1])
        except OSError:
            break
        time.sleep(0.1)
    reply = read_all(slow)
    assert reply.startswith(b"HTTP/1.1 408") and b"header_timeout" in reply
    assert read_all(idle) == b""  # nothing was sent on it: closed without a word
    assert time.monotonic() - started < 6
    # others were served all along
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_slow_body_gets_408(server: ServerProcess) -> None:
    s = raw_connection(server)
    body = b'{"prompt": "hi", "max_tokens": 1}'
    s.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
    started = time.monotonic()
    reply = read_all(s)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "body_timeout" and 1.5 < time.monotonic() - started < 6


def test_keep_alive_connection_dripping_the_next_request_is_cut(server: ServerProcess) -> None:
    s = raw_connection(server)
    s.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    first = b""
    while not first.endswith(b"}"):
        first += s.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    for b in b"GET /healthz HTTP/1.1\r\n":
        try:
            s.send(bytes([b]))
        except OSError:
            break
        time.sleep(0.1)
    assert read_all(s).startswith(b"HTTP/1.1 408")
    assert time.monotonic() - started < 4


def test_stalled_stream_is_cancelled_at_the_buffer_limit(server: ServerProcess) -> None:
    before = server.metrics().get("llamaserve_slow_client_cancels_total", 0)
    s = raw_connection(server, rcvbuf=2048)
    body = json.dumps({"prompt": "Count:", "max_tokens": 3000, "ignore_eos": True,
                       "temperature": 0, "stream": True, "n": 4}).encode()
    s.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body) + body)
    # never read: meanwhile another client is served normally
    r = httpx.post(f"{server.base_url}/completions", timeout=120,
                   json={"prompt": "Hello", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200
    deadline = time.monotonic() + 120  # seconds on a loaded 2-core machine, usually 1-2 s
    while time.monotonic() < deadline:
        m = server.metrics()
        if m.get("llamaserve_slow_client_cancels_total", 0) > before:
            break
        time.sleep(0.5)
    assert m.get("llamaserve_slow_client_cancels_total", 0) == before + 4  # n = 4 sequences
    assert m["llamaserve_sequences_finished_total{reason=cancelled}"] >= 1
    tokens = m["llamaserve_generated_tokens_total"]
    assert tokens < 3000  # cancelled long before max_tokens
    # the stalled client finally reads: its stream ends with an error event
    data = read_all(s)
    assert b"client_too_slow" in data
    assert server.metrics()["llamaserve_requests_running"] == 0


def test_endless_headers_get_431_without_filling_memory(server: ServerProcess) -> None:
    """A client sending header lines as fast as it can, within the header deadline: past
    64 KiB of request head it gets a 431 error object and the connection closes (the
    HTTP parser would buffer them all); the server's memory stays put."""
    def rss() -> int:
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        return int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1])

    before = rss()
    s = raw_connection(server)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    line = b"X-Junk: " + b"a" * 8000 + b"\r\n"
    try:
        for _ in range(4000):  # 32 MB
            s.sendall(line)
    except OSError:
        pass  # closed on us: what should happen
    reply = read_all(s)
    assert reply.startswith(b"HTTP/1.1 431") and b"headers_too_large" in reply
    assert rss() - before < 16 * 1024  # KiB
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_a_body_arriving_after_its_answer_is_not_taken_for_the_next_head(
        server: ServerProcess) -> None:
    """A route can answer before reading the body (a 404, an error): the body's bytes that
    follow on the kept-alive connection belong to that request, not to the next one's
    head: the 64 KiB head limit does not count them, and the next head's deadline starts
    when they end."""
    s = raw_connection(server)
    body = b"x" * 300_000
    s.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
    first = b""
    while b"\r\n\r\n" not in first or not first.endswith(b"}"):
        first += s.recv(65536)
    assert first.startswith(b"HTTP/1.1 404")  # answered, the body not yet sent
    for i in range(0, len(body), 16384):
        s.sendall(body[i:i + 16384])
        time.sleep(0.002)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    second = b""
    while not second.endswith(b"}"):
        chunk = s.recv(65536)
        assert chunk, second
        second += chunk
    assert second.startswith(b"HTTP/1.1 200"), second[:200]
    s.close()
