"""One model across machines (``model.rpc_servers``): the config field, the start-up
checks, the connection watch and the abort handler without a model; then Qwen2.5-Coder-0.5B
split across two real rpc-servers on loopback (plus this process's CPU), its greedy output
against local serving, and what a killed rpc-server does to the server."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import (
    ROOT,
    RpcServerProcess,
    ServerProcess,
    free_port,
    qwen_config,
    require_model,
    require_rpc,
    start_rpc_server,
    start_server,
)
from engine.backends import rpc
from engine.backends.rpc import RpcBackend, RpcError, hello
from engine.backends.rpc_watch import ConnectionWatch
from engine.config import ConfigError, parse
from engine.config_flags import add_flags, config_data

# -- config -------------------------------------------------------------------------------


def model_with(**fields: Any) -> dict[str, Any]:
    return {"model": {"path": "/m.gguf", **fields}}


def test_rpc_servers_are_read_as_endpoints() -> None:
    cfg = parse(model_with(rpc_servers=["10.0.0.2:50052", "gpu-box:50053"]))
    assert cfg.model.rpc_servers == ("10.0.0.2:50052", "gpu-box:50053")
    assert parse(model_with()).model.rpc_servers == ()


@pytest.mark.parametrize(("entry", "message"), [
    ("10.0.0.2", "expected host:port"),
    ("10.0.0.2:", "expected host:port"),
    (":50052", "expected host:port"),
    ("[::1]:50052", "expected host:port"),
    ("::1:50052", "expected host:port"),
    ("host:0", "expected host:port"),
    ("host:65536", "expected host:port"),
    ("host:port", "expected host:port"),
    ("my host:1", "expected host:port"),
    ("10.0.0.1:50052", "is listed twice"),
])
def test_a_bad_rpc_server_entry_is_named(entry: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse(model_with(rpc_servers=["10.0.0.1:50052", entry]))
    assert str(exc.value).startswith("model.rpc_servers[1]: ") and message in str(exc.value)


def test_rpc_servers_must_be_a_list_of_strings() -> None:
    for value in ("10.0.0.1:50052", [50052], [""]):
        with pytest.raises(ConfigError, match=r"^model\.rpc_servers"):
            parse(model_with(rpc_servers=value))


def test_rpc_flag_sets_the_field() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["-m", "/m.gguf", "--rpc", "a:1, b:2"])
    assert parse(config_data(args)).model.rpc_servers == ("a:1", "b:2")


# -- start-up checks (no model) ----------------------------------------------------------------


def test_an_unreachable_server_is_named() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(RpcError, match=rf"RPC server {endpoint} is unreachable"):
        hello(endpoint, timeout=2)


def test_a_server_that_never_answers_times_out_with_a_hint() -> None:
    """As a real rpc-server busy with another client: the kernel accepts, nobody answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(RpcError, match=r"did not answer in 0\.5 s .*one client at a time"):
            hello(endpoint, timeout=0.5)
        assert time.monotonic() - started < 3


def test_something_else_on_the_port_is_not_taken_for_an_rpc_server() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(RpcError, match="did not answer like an rpc-server"):
            hello(endpoint, timeout=2)


def test_bindings_without_rpc_are_a_start_up_error_saying_how_to_rebuild(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "supports_rpc", lambda: False)
    with pytest.raises(RpcError) as exc:
        RpcBackend.connect(("127.0.0.1:1",))
    assert "built without the RPC backend" in str(exc.value)
    assert 'CMAKE_ARGS="-DGGML_RPC=on"' in str(exc.value)


# -- the connection watch (no model) -------------------------------------------------------------


def test_watch_reports_a_peer_that_closes_and_not_our_own_close() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        down: list[tuple[str, str]] = []
        watch = ConnectionWatch((endpoint,), lambda e, why: down.append((e, why)), 0.2)
        watch.start()
        try:
            assert watch.watching() == [endpoint]
            assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            time.sleep(0.5)
            assert down == []  # an idle, healthy connection
            peer.close()
            deadline = time.monotonic() + 3
            while not down and time.monotonic() < deadline:
                time.sleep(0.05)
            assert down == [(endpoint, "closed the connection")]
        finally:
            watch.stop()
            client.close()
        # our side closing (llama.cpp freeing the model) is not a failure
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        down.clear()
        watch = ConnectionWatch((endpoint,), lambda e, why: down.append((e, why)), 0.2)
        watch.start()
        try:
            client.close()
            time.sleep(0.8)
            assert down == []
        finally:
            watch.stop()
            peer.close()


# -- ggml aborts (a subprocess each: the handler is process-wide) ---------------------------------

ABORT_SCRIPT = """
import ctypes, sys, threading
sys.path.insert(0, {root!r})
from engine.backends import ggml, rpc

class Listener:  # stands for a watched RpcBackend
    def _aborted(self, message):
        print("reported:", message, flush=True)

rpc._install_abort_handler()
if sys.argv[1] == "listener":
    rpc._listeners.append(Listener())
abort = ggml.lib().ggml_abort
abort.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
thread = threading.Thread(target=abort, daemon=True, args=(
    b"/src/ggml/src/ggml-rpc/ggml-rpc.cpp", 566, b"Remote RPC server crashed"))
thread.start()
thread.join(2)
print("blocked:", thread.is_alive(), flush=True)
"""


def run_abort_script(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ABORT_SCRIPT.format(root=str(ROOT)), mode],
                          capture_output=True, text=True, timeout=60)


def test_an_abort_is_reported_and_its_thread_held_instead_of_killing_the_process() -> None:
    done = run_abort_script("listener")
    assert done.returncode == 0, done.stderr
    assert "reported: ggml-rpc.cpp:566: Remote RPC server crashed" in done.stdout
    assert "blocked: True" in done.stdout


def test_an_abort_with_nobody_to_report_to_exits_1_saying_why() -> None:
    done = run_abort_script("none")
    assert done.returncode == 1
    assert "llamaserve: llama.cpp aborted: ggml-rpc.cpp:566: Remote RPC server crashed" \
        in done.stderr


# -- real rpc-servers and the real model ------------------------------------------------------


@pytest.fixture(scope="module")
def rpc_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RpcServerProcess]]:
    require_rpc()
    require_model("qwen-0.5b")
    tmp = tmp_path_factory.mktemp("rpc")
    servers = [start_rpc_server(tmp), start_rpc_server(tmp)]
    yield servers
    for s in servers:
        s.kill()


def split_config(servers: list[RpcServerProcess], **model: Any) -> dict[str, Any]:
    # 9 of Qwen's 24 layers stay on this process's CPU; 15 + the output layer are offloaded,
    # half to each rpc-server
    cfg = qwen_config(n_ctx=2048, n_seq_max=2, threads=1, threads_batch=1,
                      rpc_servers=[s.endpoint for s in servers], n_gpu_layers=16,
                      tensor_split=[1, 1], **model)
    cfg["server"].update(log_level="debug", engine_failure_exit=8)
    return cfg


@pytest.fixture(scope="module")
def split_server(rpc_servers: list[RpcServerProcess],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(split_config(rpc_servers), tmp_path_factory.mktemp("split"))
    yield server
    server.stop()


def test_layers_are_placed_on_both_rpc_servers(split_server: ServerProcess,
                                               rpc_servers: list[RpcServerProcess]) -> None:
    log = split_server.log()
    assert "offloaded 16/25 layers to GPU" in log
    assert "CPU_Mapped model buffer size" in log  # the first layers stayed here
    metrics = split_server.metrics()
    for s in rpc_servers:
        assert f"[{s.endpoint}] model buffer size" in log  # weights live there
        assert metrics[f"llamaserve_rpc_server_up{{endpoint={s.endpoint}}}"] == 1


PROMPTS = ["def quicksort(items):", "The three primary colors are",
           "# SQL: the ten most recent orders\nSELECT"]


def greedy(server: ServerProcess, prompt: str) -> tuple[list[str], list[dict[str, float]]]:
    r = httpx.post(f"{server.base_url}/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 2})
    r.raise_for_status()
    lp = r.json()["choices"][0]["logprobs"]
    return lp["tokens"], lp["top_logprobs"]


def test_split_greedy_output_equals_local_serving(split_server: ServerProcess,
                                                  tmp_path: Path) -> None:
    """Token for token, or up to a near-tie: where the two first differ, local serving had
    both tokens in its top two, less than 0.25 nats apart: the rpc-servers get plain weight
    buffers while this process repacks some weights for other CPU kernels, and logprobs
    differed by up to 0.12 nats between the two here."""
    local = start_server(qwen_config(n_ctx=2048, n_seq_max=2, threads=1, threads_batch=1),
                         tmp_path)
    try:
        for prompt in PROMPTS:
            split_tokens, _ = greedy(split_server, prompt)
            local_tokens, local_top = greedy(local, prompt)
            for i, (a, b) in enumerate(zip(split_tokens, local_tokens, strict=True)):
                if a != b:
                    top = local_top[i]
                    assert a in top and b in top, (prompt, i, a, b, top)
                    assert abs(top[a] - top[b]) < 0.25, (prompt, i, a, b, top)
                    break
    finally:
        local.stop()


def test_a_killed_rpc_server_fails_requests_and_the_server_exits_1(
        split_server: ServerProcess, rpc_servers: list[RpcServerProcess]) -> None:
    """Mid-stream: the stream ends with a backend_unavailable error naming the server
    within seconds (not at max_tokens, never a hang), /healthz turns 503, a new request
    gets 503, and the process exits 1 after server.engine_failure_exit."""
    victim = rpc_servers[1]
    body = {"prompt": "Count:", "max_tokens": 1500, "ignore_eos": True, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{split_server.base_url}/completions", json=body,
                      timeout=30) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data:"))
        assert '"text"' in next(lines)
        victim.kill()
        killed = time.monotonic()
        rest = list(lines)
    assert time.monotonic() - killed < 10
    error = json.loads(rest[-1][5:])["error"]
    assert error["code"] == "backend_unavailable" and victim.endpoint in error["message"]
    health = httpx.get(f"{split_server.url}/healthz", timeout=10)
    assert health.status_code == 503 and victim.endpoint in health.json()["reason"]
    r2 = httpx.post(f"{split_server.base_url}/completions", timeout=10,
                    json={"prompt": "Hi", "max_tokens": 2})
    assert r2.status_code == 503 and r2.json()["error"]["code"] == "backend_unavailable"
    assert split_server.proc.wait(45) == 1
    assert f"llamaserve: engine failed: RPC server {victim.endpoint}" in split_server.log()


def test_an_unreachable_rpc_server_stops_the_start_with_its_address(
        rpc_servers: list[RpcServerProcess], tmp_path: Path) -> None:
    cfg = split_config(rpc_servers)
    dead = f"127.0.0.1:{free_port()}"
    cfg["model"]["rpc_servers"] = [dead, rpc_servers[0].endpoint]
    server = start_server(cfg, tmp_path, wait=False)
    try:
        assert server.proc.wait(60) == 1
    finally:
        server.stop()
    assert f"RPC server {dead} is unreachable" in server.log()


def test_check_does_each_servers_handshake(tmp_path: Path) -> None:
    require_rpc()
    live = start_rpc_server(tmp_path)
    dead = f"127.0.0.1:{free_port()}"
    try:
        for servers, status, expected in [
                ([live.endpoint], 0, f"RPC server {live.endpoint}: rpc-server protocol 7."),
                ([live.endpoint, dead], 1, f"RPC server {dead} is unreachable")]:
            cfg_path = tmp_path / "c.json"
            cfg_path.write_text(json.dumps(qwen_config(rpc_servers=servers)))
            done = subprocess.run([sys.executable, str(ROOT / "server.py"), "check", "-C",
                                   str(cfg_path)], capture_output=True, text=True, timeout=120)
            assert done.returncode == status, done.stderr
            assert expected in done.stdout + done.stderr
    finally:
        live.kill()
