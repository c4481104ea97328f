"""A request's room in the context, through the real clients on the tiny Qwen-tokenizer model.

- The KV layout keeps ``model.n_ctx`` as the context one request may use: a config written
  for the earlier default (``n_ctx`` 8192, ``n_seq_max`` 16, no ``kv_unified``) serves a
  prompt of up to ``n_ctx`` minus its completion (split per sequence above four sequences,
  it refused a 1,955-token prompt as "maximum context length is 512").
- ``max_tokens`` beyond the room a prompt leaves is cut to that room on every route, as
  llama-server and Ollama do (opencode asks ``max_tokens: 32000`` of a model it does not
  know): the answer ends at the context's end with its route's "length" reason, and its
  usage adds up to the context. ``server.clamp_max_tokens: false`` keeps OpenAI's 400.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from conftest import ServerProcess, start_server, tiny_qwen_config

N_CTX = 8192
FAR = 32000  # what opencode and Claude Code ask of a model they do not know


def _config(**server: Any) -> dict[str, Any]:
    cfg = tiny_qwen_config(n_ctx=N_CTX, n_seq_max=16)
    for field in ("kv_unified", "max_output_tokens"):  # the defaults are what is tested
        del cfg["model"][field]
    cfg["server"].update(server)
    return cfg


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = start_server(_config(), tmp_path_factory.mktemp("room"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def _chat_prompt_tokens(client: OpenAI, words: int) -> int:
    r = client.chat.completions.create(model="x", max_tokens=1, messages=[
        {"role": "user", "content": "tick " * words}])
    assert r.usage is not None
    return r.usage.prompt_tokens


@pytest.fixture(scope="module")
def near_full(client: OpenAI) -> str:
    """A user message whose chat prompt leaves 100-200 tokens of the context."""
    a, b = _chat_prompt_tokens(client, 1000), _chat_prompt_tokens(client, 2000)
    per = (b - a) / 1000
    words = 1000 + round((N_CTX - 150 - a) / per)
    prompt = _chat_prompt_tokens(client, words)
    assert N_CTX - 250 < prompt < N_CTX - 50, prompt
    return "tick " * words


def test_the_default_layout_gives_one_request_all_of_n_ctx(client: OpenAI,
                                                           near_full: str) -> None:
    r = client.chat.completions.create(model="x", max_tokens=40, messages=[
        {"role": "user", "content": near_full}])
    assert r.usage is not None and r.usage.prompt_tokens > N_CTX - 250
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40
    model = httpx.get(f"{client.base_url}models", timeout=10).json()["data"][0]
    assert model["max_model_len"] == model["meta"]["n_ctx_seq"] == N_CTX


def _ends_at_the_context(prompt: int, completion: int) -> None:
    assert prompt > N_CTX - 250 and prompt + completion == N_CTX, (prompt, completion)


def test_chat_completions_clamp(client: OpenAI, near_full: str) -> None:
    msgs: Any = [{"role": "user", "content": near_full}]
    r = client.chat.completions.create(model="x", max_tokens=FAR, messages=msgs)
    assert r.usage is not None and r.choices[0].finish_reason == "length"
    _ends_at_the_context(r.usage.prompt_tokens, r.usage.completion_tokens)
    # the newer field and a stream, usage in its last chunk
    chunks = list(client.chat.completions.create(
        model="x", max_completion_tokens=FAR, messages=msgs, stream=True,
        stream_options={"include_usage": True}))
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    usage = chunks[-1].usage
    assert reasons[-1] == "length" and usage is not None
    _ends_at_the_context(usage.prompt_tokens, usage.completion_tokens)


def test_completions_clamp(client: OpenAI, near_full: str) -> None:
    r = client.completions.create(model="x", prompt=near_full, max_tokens=FAR)
    assert r.usage is not None and r.choices[0].finish_reason == "length"
    _ends_at_the_context(r.usage.prompt_tokens, r.usage.completion_tokens)


def test_responses_clamp(client: OpenAI, near_full: str) -> None:
    r = client.responses.create(model="x", input=near_full, max_output_tokens=FAR)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.usage is not None
    _ends_at_the_context(r.usage.input_tokens, r.usage.output_tokens)


@pytest.mark.parametrize("route", ["chat", "generate"])
def test_ollama_clamp(server: ServerProcess, near_full: str, route: str) -> None:
    body: dict[str, Any] = {"model": "tiny-qwen", "stream": False,
                            "options": {"num_predict": FAR}}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": near_full}]
    else:
        body["prompt"] = near_full
    r = httpx.post(f"{server.url}/api/{route}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["done_reason"] == "length"
    _ends_at_the_context(out["prompt_eval_count"], out["eval_count"])


def test_a_prompt_past_the_context_is_still_a_400(client: OpenAI, near_full: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="x", max_tokens=FAR, messages=[
            {"role": "user", "content": near_full + "tick " * 300}])
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
    assert "model.n_ctx" in body["message"] and str(N_CTX) in body["message"]


def test_the_switch_keeps_openais_400(tmp_path: Path) -> None:
    s = start_server(_config(clamp_max_tokens=False), tmp_path)
    try:
        c = OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model="x", max_tokens=N_CTX, messages=[
                {"role": "user", "content": "tick " * 100}])
        body = err.value.body
        assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
        assert str(N_CTX) in body["message"] and "max_tokens" in body["message"]
        r = c.chat.completions.create(model="x", max_tokens=8, messages=[
            {"role": "user", "content": "tick " * 100}])
        assert r.choices[0].finish_reason == "length"
    finally:
        s.stop()
