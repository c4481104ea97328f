"""Two replicas on loopback behind a real nginx (Debian's, running deploy/nginx.conf as
shipped): sticky sessions, a shared disk cache and Responses store, and a rolling restart
that drops nothing. What is tested is routing and shared state, not answers: the replicas
serve the tiny random-weight llama with Qwen2.5-Coder's real tokenizer and template
(tests/make_tiny_model.py), one thread each (the 0.5B model took ~75 s of CI here)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from nginx_proxy import NginxProxy, nginx_binary, start_nginx

from conftest import ServerProcess, free_port, start_server, tiny_qwen_config

pytestmark = pytest.mark.skipif(nginx_binary() is None and not os.environ.get("CI"),
                                reason="nginx not installed (apt-get install nginx)")

SYSTEM = ("You are a careful assistant for a software team. " + " ".join(
    f"Rule {i}: keep answers short, cite file names, never invent APIs, prefer small "
    "diffs, and explain trade-offs when asked." for i in range(1, 25)))


def replica_config(shared: Path) -> dict[str, Any]:
    cfg = tiny_qwen_config(threads=1, threads_batch=1, n_ctx=4096, n_seq_max=4)
    cfg["server"].update({"responses_store_path": str(shared / "responses"),
                          "reasoning_key": "shared-secret-for-both-replicas",
                          "drain_timeout": 60})
    cfg["disk_cache"] = {"path": str(shared / "kv"), "max_bytes": 2 << 30, "min_tokens": 64}
    return cfg


@dataclass
class Cluster:
    replicas: list[ServerProcess]
    nginx: NginxProxy

    def replica(self, upstream: str) -> ServerProcess:
        """The replica behind an X-Upstream value (the last address when nginx retried)."""
        port = int(upstream.split(",")[-1].strip().rsplit(":", 1)[1])
        return next(r for r in self.replicas if r.port == port)

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.nginx.url}/v1", api_key="none",
                             default_headers=headers, max_retries=0, timeout=120)

    def key_for(self, replica: ServerProcess, avoid: set[str] = frozenset()) -> str:  # type: ignore[assignment]
        """A session key nginx hashes to ``replica`` (found by asking, as a client could)."""
        for i in range(200):
            key = f"probe-{i}"
            if key in avoid:
                continue
            r = httpx.get(f"{self.nginx.url}/v1/models", headers={"x-session-id": key})
            if self.replica(r.headers["x-upstream"]) is replica:
                return key
        raise AssertionError("no key hashed to that replica")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("replicas")
    shared = tmp / "shared"
    replicas = [start_server(replica_config(shared), tmp) for _ in range(2)]
    nginx = start_nginx(tmp / "nginx", free_port(), [r.port for r in replicas])
    yield Cluster(replicas, nginx)
    nginx.stop()
    for r in replicas:
        r.stop()


def chat(client: openai.OpenAI, text: str, **extra: Any) -> tuple[Any, httpx.Headers]:
    raw = client.chat.completions.with_raw_response.create(
        model="qwen", messages=[{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": text}],
        max_tokens=8, temperature=0, **extra)
    return raw.parse(), raw.headers


def test_a_sessions_turns_stay_on_one_replica_and_sessions_spread(cluster: Cluster) -> None:
    homes: dict[str, str] = {}
    for key in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot"):
        client = cluster.client(**{"x-session-id": key})
        _, first = chat(client, "Say hi.")
        _, second = chat(client, "Say bye.")
        assert first["x-session-id"] == second["x-session-id"] == key  # echoed
        assert first["x-upstream"] == second["x-upstream"]
        homes[key] = first["x-upstream"]
    # consistent hashing uses both replicas: six keys all land on one about 3% of the time
    # (the ring depends on the replicas' random ports), so the spread is asked of 32 keys
    for i in range(32):
        r = httpx.get(f"{cluster.nginx.url}/v1/models", headers={"x-session-id": f"spread-{i}"})
        homes[f"spread-{i}"] = r.headers["x-upstream"]
    assert len(set(homes.values())) == 2, homes
    # the body's user field routes too, with no header (nginx reads the body)
    plain = cluster.client()
    _, one = chat(plain, "Say hi.", user="user-1234")
    _, two = chat(plain, "Say bye.", user="user-1234")
    assert one["x-session-id"] == "user-1234" and one["x-upstream"] == two["x-upstream"]


def test_responses_chain_without_any_key_stays_on_its_replica(cluster: Cluster) -> None:
    """Turn 1 has no key: nginx makes one up ($request_id) and passes it on; the replica
    puts it into the response id, and turn 2, naming only previous_response_id, hashes to
    the same replica."""
    client = cluster.client()
    for _ in range(4):
        raw = client.responses.with_raw_response.create(
            model="qwen", input=SYSTEM + " Name a colour.", max_output_tokens=8,
            temperature=0)  # input, not instructions: those are not carried over
        first = raw.parse()
        key = first.id.split(".", 1)[1]
        assert raw.headers["x-session-id"] == key and len(key) == 32
        raw2 = client.responses.with_raw_response.create(
            model="qwen", previous_response_id=first.id, input="Another one.",
            max_output_tokens=8, temperature=0)
        second = raw2.parse()
        assert second.id.endswith("." + key)
        assert raw2.headers["x-upstream"] == raw.headers["x-upstream"]
        assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens // 2


def test_previous_response_id_continues_on_the_other_replica(cluster: Cluster) -> None:
    a, b = cluster.replicas
    key_a, key_b = cluster.key_for(a), cluster.key_for(b)
    raw = cluster.client(**{"x-session-id": key_a}).responses.with_raw_response.create(
        model="qwen", instructions="Answer in one word.",
        input="My name is Zorblax. Reply with OK.", max_output_tokens=4, temperature=0)
    first = raw.parse()
    assert cluster.replica(raw.headers["x-upstream"]) is a
    on_b = cluster.client(**{"x-session-id": key_b})
    raw2 = on_b.responses.with_raw_response.create(
        model="qwen", previous_response_id=first.id, input="What is my name?",
        max_output_tokens=8, temperature=0)
    second = raw2.parse()
    assert cluster.replica(raw2.headers["x-upstream"]) is b
    # turn 1 (instructions aside) was in turn 2's prompt, read from the shared store on B
    assert second.usage.input_tokens > first.usage.input_tokens
    # retrieval and deletion work from either replica
    assert on_b.responses.retrieve(first.id).id == first.id
    cluster.client(**{"x-session-id": key_a}).responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        on_b.responses.retrieve(second.id)


def test_a_prefix_prefilled_on_one_replica_is_a_disk_hit_on_the_other(cluster: Cluster) -> None:
    a, b = cluster.replicas
    key_a, key_b = cluster.key_for(a), cluster.key_for(b)
    prefix = SYSTEM + " Project notes: " + " ".join(f"module_{i}.py" for i in range(120))
    saves = a.metrics().get("llamaserve_disk_cache_saves_total", 0)
    msgs = [{"role": "system", "content": prefix}, {"role": "user", "content": "Hi."}]
    first = cluster.client(**{"x-session-id": key_a}).chat.completions.create(
        model="qwen", messages=msgs, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    deadline = time.monotonic() + 30
    while a.metrics().get("llamaserve_disk_cache_saves_total", 0) <= saves:
        assert time.monotonic() < deadline, "replica A never saved the prompt"
        time.sleep(0.2)
    hits = b.metrics().get("llamaserve_disk_cache_hits_total", 0)
    msgs[1]["content"] = "Hello there."
    second = cluster.client(**{"x-session-id": key_b}).chat.completions.create(
        model="qwen", messages=msgs, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert b.metrics()["llamaserve_disk_cache_hits_total"] == hits + 1
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached >= first.usage.prompt_tokens - 16, (cached, first.usage)  # type: ignore[union-attr]


def _stream(url: str, key: str, results: list[tuple[str, str]]) -> None:
    """One streamed chat request through nginx; records ('ok', upstream) or the failure."""
    body = {"model": "qwen", "stream": True, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": f"Count from 1 to 20. ({key})"}]}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=180,
                          headers={"x-session-id": key}) as r:
            if r.status_code != 200:
                results.append((f"status {r.status_code}: {r.read()!r}", ""))
                return
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        finished = any(json.loads(line[6:])["choices"][0].get("finish_reason")
                       for line in lines[:-1] if line != "data: [DONE]") if lines else False
        ok = lines and lines[-1] == "data: [DONE]" and finished
        results.append(("ok" if ok else f"incomplete stream: {lines[-3:]}",
                        r.headers.get("x-upstream", "")))
    except httpx.HTTPError as exc:
        results.append((f"{type(exc).__name__}: {exc}", ""))


def test_sigterm_to_one_replica_under_load_drops_no_request(cluster: Cluster) -> None:
    a, b = cluster.replicas
    results: list[tuple[str, str]] = []
    stop = threading.Event()

    def client_loop(n: int) -> None:
        i = 0
        while not stop.is_set():
            _stream(cluster.nginx.url, f"load-{n}-{i}", results)
            i += 1

    threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while a.metrics().get("llamaserve_http_in_flight", 0) < 1:  # A is serving some of them
        assert time.monotonic() < deadline
        time.sleep(0.05)
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(90) == 0  # drained and exited cleanly
    after = len(results)
    time.sleep(4)  # traffic keeps flowing to B alone
    stop.set()
    for t in threads:
        t.join(200)
    failures = [r for r in results if r[0] != "ok"]
    assert not failures, failures
    assert len(results) > after  # requests were served after A left
    served_by = {cluster.replica(u).port for _, u in results}
    assert served_by == {a.port, b.port}
    assert all(cluster.replica(u) is b for _, u in results[after + 6:])
