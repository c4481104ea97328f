"""Several models behind one server (a ``models`` list), through the OpenAI SDK.

Three real models: Qwen2.5-Coder-0.5B (chat), Gemma 3 270M (completions) and
all-MiniLM-L6-v2 (embeddings), at most two loaded at once: using the third unloads the
least recently used, and a model that comes back starts warm from the disk cache its
engine saved when it was unloaded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import NotFoundError, OpenAI

from conftest import (
    ServerProcess,
    gemma_config,
    minilm_config,
    qwen_config,
    start_server,
)

LONG_SYSTEM = "You are a careful assistant. " + " ".join(
    f"Rule {i}: answer questions about item {i * 7 % 97} in one sentence." for i in range(40))


def several(tmp: Path, **server: Any) -> dict[str, Any]:
    coder = {**qwen_config()["model"], "alias": "coder", "n_seq_max": 2}
    base = {**gemma_config()["model"], "alias": "base", "n_seq_max": 2}
    embed = {**minilm_config()["model"], "alias": "embed"}
    return {"server": {"max_loaded_models": 2, **server}, "models": [coder, base, embed],
            "disk_cache": {"path": str(tmp / "disk"), "min_tokens": 32}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("several")
    s = start_server(several(tmp), tmp)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def loaded(client: OpenAI) -> dict[str, bool]:
    return {m.id: bool(m.model_extra["meta"]["loaded"])  # type: ignore[index]
            for m in client.models.list().data}


def chat(client: OpenAI, text: str = "Say hi.") -> Any:
    return client.chat.completions.create(
        model="coder", temperature=0, max_tokens=4,
        messages=[{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": text}])


def test_models_lists_every_model_and_only_the_first_is_loaded_at_start(client: OpenAI) -> None:
    assert loaded(client) == {"coder": True, "base": False, "embed": False}


def test_requests_are_routed_by_model_and_unknown_models_are_404(
        client: OpenAI, server: ServerProcess) -> None:
    assert chat(client).model == "coder"
    done = client.completions.create(model="base", prompt="The capital of France is",
                                     max_tokens=3, temperature=0)
    assert done.model == "base" and done.choices[0].text
    with pytest.raises(NotFoundError) as err:
        client.chat.completions.create(model="nope", max_tokens=1,
                                       messages=[{"role": "user", "content": "x"}])
    assert err.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert err.value.body["param"] == "model"  # type: ignore[index]
    # no model field: the first model
    r = httpx.post(f"{server.base_url}/completions", json={"prompt": "1 2 3", "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "coder"
    # an embedding model answers chat with its own 400, not a 404
    with pytest.raises(Exception) as bad:
        client.chat.completions.create(model="embed", max_tokens=1,
                                       messages=[{"role": "user", "content": "x"}])
    assert "embedding model" in str(bad.value)


def test_the_least_recently_used_model_is_unloaded_and_comes_back_warm(
        client: OpenAI, server: ServerProcess) -> None:
    first = chat(client, "Warm me up.")
    client.completions.create(model="base", prompt="Hello", max_tokens=2)  # coder is LRU now
    vectors = client.embeddings.create(model="embed", input=["one", "two"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 384
    assert loaded(client) == {"coder": False, "base": True, "embed": True}
    started = time.monotonic()
    again = chat(client, "Warm me up.")
    reload_s = time.monotonic() - started
    assert loaded(client)["coder"]
    # the unloaded engine's sequences are on disk: the long shared prefix is not recomputed
    # (a tail shorter than disk_cache.min_tokens past a stored prefix is not saved)
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 32
    assert again.choices[0].message.content == first.choices[0].message.content
    assert reload_s < 60
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'llamaserve_model_loaded{model="coder"} 1' in metrics
    assert 'llamaserve_model_loaded{model="embed"} 0' in metrics or \
        'llamaserve_model_loaded{model="base"} 0' in metrics
    assert 'llamaserve_generated_tokens_total{model="coder"}' in metrics


def test_responses_websocket_routes_by_model(server: ServerProcess) -> None:
    import json

    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/v1/responses") as ws:
        for model, expect in (("base", "base"), ("nope", None)):
            ws.send(json.dumps({"type": "response.create", "model": model, "input": "Hi",
                                "max_output_tokens": 2}))
            while True:
                event = json.loads(ws.recv(timeout=120))
                if event["type"] in ("response.completed", "response.incomplete", "error"):
                    break
            if expect is None:
                assert event["type"] == "error" and event["error"]["code"] == "model_not_found"
            else:
                assert event["response"]["model"] == expect


def test_idle_models_are_unloaded(tmp_path: Path) -> None:
    cfg = several(tmp_path, model_idle_seconds=2, max_loaded_models=0)
    cfg["models"] = cfg["models"][1:]  # base and embed
    s = start_server(cfg, tmp_path)
    try:
        c = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
        c.embeddings.create(model="embed", input="hello")
        assert loaded(c) == {"base": True, "embed": True}
        deadline = time.monotonic() + 20
        while any(loaded(c).values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert loaded(c) == {"base": False, "embed": False}
        assert c.embeddings.create(model="embed", input="back").data  # loads again
        assert httpx.get(f"{s.url}/healthz", timeout=10).status_code == 200
    finally:
        s.stop()
