"""Ollama's API (/api/chat, /api/generate, /api/embed, /api/tags …) through the official
`ollama` Python library against real servers: Qwen2.5-Coder-0.5B (chat, generate, tools,
formats) and all-MiniLM-L6-v2 (embeddings), each answer checked against the OpenAI route
that shares its path. Plus the pure parts (names, options) without a model."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import numpy as np
import pytest

from conftest import (
    ServerProcess,
    require_library,
    require_model,
    start_server,
    thinking_qwen_config,
)

require_library("ollama")

from ollama import Client, ResponseError  # noqa: E402

import media_samples as samples  # noqa: E402
from api.ollama.names import candidates, listed_name, split_tag  # noqa: E402
from api.ollama.options import check_keep_alive, response_format, sampling_params  # noqa: E402
from api.web.errors import APIError  # noqa: E402
from api.web.gate import Gate, GateState, HttpMetrics  # noqa: E402
from engine.config import ServerConfig  # noqa: E402

QWEN = "qwen2.5-coder-0.5b-instruct"
MINILM = "all-minilm-l6-v2"
GREEDY = {"temperature": 0}
COUNT = [{"role": "user", "content": "Count from 1 to 9, separated by commas. Only the numbers."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
NS_FIELDS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def qwen(qwen_server: ServerProcess) -> Client:
    return Client(host=qwen_server.url, timeout=180)


@pytest.fixture(scope="module")
def minilm(minilm_server: ServerProcess) -> Client:
    return Client(host=minilm_server.url, timeout=60)


def openai_chat(server: ServerProcess, messages: list[dict[str, Any]], max_tokens: int) -> str:
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=180, json={
        "model": QWEN, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def check_final(final: Any, reason: str) -> None:
    assert final.done is True and final.done_reason == reason
    assert final.prompt_eval_count > 0 and final.eval_count > 0
    for name in NS_FIELDS:
        assert isinstance(final[name], int) and final[name] >= 0, name
    assert final.total_duration >= final.prompt_eval_duration + final.eval_duration


# -- chat, generate, options -----------------------------------------------------------------

def test_chat_streamed_and_whole_give_the_greedy_text_of_chat_completions(
        qwen: Client, qwen_server: ServerProcess) -> None:
    chunks = list(qwen.chat(model=QWEN, messages=COUNT, stream=True,
                            options={**GREEDY, "num_predict": 6}))
    assert len(chunks) > 3 and all(not c.done for c in chunks[:-1])
    streamed = "".join(c.message.content or "" for c in chunks)
    check_final(chunks[-1], "length")
    assert chunks[-1].eval_count == 6 and chunks[-1].message.content == ""
    assert chunks[-1].model == QWEN and chunks[-1].created_at
    whole = qwen.chat(model=f"{QWEN}:latest", messages=COUNT, options={**GREEDY,
                                                                       "num_predict": 6})
    assert whole.model == f"{QWEN}:latest" and whole.message.role == "assistant"
    check_final(whole, "length")
    assert streamed == whole.message.content == openai_chat(qwen_server, COUNT, 6)
    assert streamed.startswith("1, 2,")


def test_generate_renders_one_user_turn_and_returns_a_context(qwen: Client) -> None:
    r = qwen.generate(model=QWEN, prompt=COUNT[0]["content"], options={**GREEDY,
                                                                      "num_predict": 6})
    check_final(r, "length")
    assert r.response.startswith("1, 2,")
    chat = qwen.chat(model=QWEN, messages=COUNT, options={**GREEDY, "num_predict": 6})
    assert r.response == chat.message.content and r.prompt_eval_count == chat.prompt_eval_count
    assert r.context is not None and len(r.context) == r.prompt_eval_count + r.eval_count
    # the context goes before the next prompt (its BOS dropped)
    more = qwen.generate(model=QWEN, prompt="Now from 10.", context=r.context,
                         options={**GREEDY, "num_predict": 2})
    assert more.prompt_eval_count > len(r.context)
    streamed = list(qwen.generate(model=QWEN, prompt="1, 2, 3,", raw=True, stream=True,
                                  options={**GREEDY, "num_predict": 3}))
    check_final(streamed[-1], "length")
    assert streamed[-1].context is None  # raw: no context, as Ollama
    assert "".join(c.response or "" for c in streamed).strip().startswith("4")
    # suffix: a fill-in-the-middle prompt from Qwen2.5-Coder's FIM tokens
    fim = qwen.generate(model=QWEN, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))",
                        options={**GREEDY, "num_predict": 4})
    assert fim.response.startswith("return a + b") and fim.context is None


def test_options_num_predict_and_stop(qwen: Client) -> None:
    r = qwen.chat(model=QWEN, messages=COUNT, options={**GREEDY, "num_predict": 3})
    assert r.done_reason == "length" and r.eval_count == 3
    r = qwen.chat(model=QWEN, messages=COUNT, options={**GREEDY, "num_predict": 20,
                                                       "stop": [", 4"], "seed": -1,
                                                       "num_ctx": 2048, "mirostat": 0})
    assert r.done_reason == "stop" and r.message.content == "1, 2, 3"


def test_format_json_and_a_schema(qwen: Client) -> None:
    ask = [{"role": "user", "content": "Give the capital of France as JSON."}]
    r = qwen.chat(model=QWEN, messages=ask, format="json", options={**GREEDY,
                                                                    "num_predict": 40})
    assert isinstance(json.loads(r.message.content or ""), dict)
    schema = {"type": "object", "properties": {"capital": {"type": "string"}},
              "required": ["capital"], "additionalProperties": False}
    r = qwen.chat(model=QWEN, messages=ask, format=schema, options={**GREEDY,
                                                                   "num_predict": 30})
    answer = json.loads(r.message.content or "")
    assert set(answer) == {"capital"} and isinstance(answer["capital"], str)
    g = qwen.generate(model=QWEN, prompt="The capital of France, as JSON.", format=schema,
                      options={**GREEDY, "num_predict": 30})
    assert set(json.loads(g.response)) == {"capital"}


def test_tools_come_back_with_object_arguments_and_results_go_back(qwen: Client) -> None:
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    chunks = list(qwen.chat(model=QWEN, messages=ask, tools=[WEATHER], stream=True,
                            options={**GREEDY, "num_predict": 48}))
    calls = [c for chunk in chunks for c in chunk.message.tool_calls or []]
    assert len(calls) == 1 and chunks[-1].done_reason == "stop"
    call = calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, dict) and call.function.arguments["city"]
    whole = qwen.chat(model=QWEN, messages=ask, tools=[WEATHER],
                      options={**GREEDY, "num_predict": 48})
    assert whole.message.tool_calls is not None
    assert whole.message.tool_calls[0].function.arguments == call.function.arguments
    # the call and its result go back (arguments as an object, the tool's name)
    back = [*ask, {"role": "assistant", "content": "",
                   "tool_calls": [{"function": {"name": "get_weather",
                                                "arguments": call.function.arguments}}]},
            {"role": "tool", "content": "18 degrees and sunny", "tool_name": "get_weather"}]
    r = qwen.chat(model=QWEN, messages=back, tools=[WEATHER], options={**GREEDY,
                                                                       "num_predict": 12})
    assert r.message.content and not r.message.tool_calls


def test_images_without_a_projector_become_the_placeholder(qwen: Client) -> None:
    image = base64.b64encode(samples.png()).decode()
    plain = qwen.chat(model=QWEN, messages=[{"role": "user", "content": "Hi"}],
                      options={**GREEDY, "num_predict": 1})
    seen = qwen.chat(model=QWEN, messages=[{"role": "user", "content": "Hi",
                                            "images": [image]}],
                     options={**GREEDY, "num_predict": 1})
    assert seen.prompt_eval_count > plain.prompt_eval_count + 3


def test_empty_requests_load_the_model(qwen: Client) -> None:
    r = qwen.chat(model=QWEN, messages=[], keep_alive=0)
    assert r.done and r.done_reason == "load"
    g = qwen.generate(model=QWEN, keep_alive="10m")
    assert g.done and g.done_reason == "load" and g.response == ""


def test_think_comes_back_as_message_thinking(tmp_path: Any) -> None:
    s = start_server(thinking_qwen_config(), tmp_path)
    try:
        c = Client(host=s.url, timeout=120)
        r = c.chat(model=QWEN, messages=[{"role": "user", "content": "What is 2+2?"}],
                   think=True, options={**GREEDY, "num_predict": 6})
        assert r.message.thinking and not r.message.content
        chunks = list(c.chat(model=QWEN, messages=[{"role": "user", "content": "What is 2+2?"}],
                             think="high", stream=True, options={**GREEDY, "num_predict": 6}))
        assert "".join(x.message.thinking or "" for x in chunks) == r.message.thinking
        assert "thinking" in c.show(QWEN).capabilities  # type: ignore[operator]
    finally:
        s.stop()


# -- embeddings ------------------------------------------------------------------------------

def test_embed_gives_the_vectors_of_v1_embeddings(minilm: Client,
                                                  minilm_server: ServerProcess) -> None:
    texts = ["The cat sits on the mat.", "Stock markets fell today."]
    r = minilm.embed(model=MINILM, input=texts)
    assert r.model == MINILM and r.prompt_eval_count and r.total_duration
    ref = httpx.post(f"{minilm_server.base_url}/embeddings", timeout=60,
                     json={"model": MINILM, "input": texts}).json()["data"]
    got = np.array(r.embeddings)
    assert got.shape == (2, 384)
    assert np.allclose(got, np.array([d["embedding"] for d in ref]), atol=1e-6)
    one = minilm.embed(model=f"{MINILM}:latest", input=texts[0], dimensions=8)
    assert len(one.embeddings[0]) == 8
    assert abs(float(np.linalg.norm(one.embeddings[0])) - 1) < 1e-5
    legacy = np.array(minilm.embeddings(model=MINILM, prompt=texts[0]).embedding)
    assert np.allclose(legacy / np.linalg.norm(legacy), got[0], atol=1e-6)  # not normalized
    assert minilm.embed(model=MINILM, input=[]).embeddings == []
    long = "word " * 600  # past the 512 tokens MiniLM embeds
    assert len(minilm.embed(model=MINILM, input=long).embeddings[0]) == 384  # truncated
    with pytest.raises(ResponseError) as err:
        minilm.embed(model=MINILM, input=long, truncate=False)
    assert err.value.status_code == 400 and "context length" in err.value.error


# -- model routes ----------------------------------------------------------------------------

def test_tags_show_ps_version(qwen: Client, qwen_server: ServerProcess) -> None:
    version = httpx.get(f"{qwen_server.url}/api/version", timeout=60).json()
    assert version["version"].count(".") == 2 and version["llamaserve"]
    (listed,) = qwen.list().models
    assert listed.model == f"{QWEN}:latest" and listed.size and listed.digest
    assert listed.details is not None and listed.details.format == "gguf"
    info = qwen.show(QWEN)
    assert info.capabilities is not None and {"completion", "tools"} <= set(info.capabilities)
    assert "thinking" not in info.capabilities and "vision" not in info.capabilities
    assert info.parameters == "num_ctx 4096" and "<|im_start|>" in (info.template or "")
    (running,) = qwen.ps().models
    assert running.model == f"{QWEN}:latest" and running.context_length == 4096
    assert running.size and running.size > listed.size  # plus the KV cache
    assert qwen.show(f"{QWEN}:latest").capabilities == info.capabilities


def test_show_model_info_is_the_gguf_metadata(qwen: Client) -> None:
    from gguf import GGUFReader, GGUFValueType
    reader = GGUFReader(require_model("qwen-0.5b"))
    scalars = {name: field.contents() for name, field in reader.fields.items()
               if field.types and field.types[0] != GGUFValueType.ARRAY
               and not name.startswith(("GGUF.", "tokenizer.chat_template"))}
    info = qwen.show(QWEN).modelinfo
    assert info is not None
    # every scalar the file holds, typed as the file types it (clients read
    # <architecture>.context_length from here)
    assert {k: v for k, v in info.items() if k in scalars} == pytest.approx(scalars)
    assert set(scalars) <= set(info)
    arch = scalars["general.architecture"]
    assert isinstance(info[f"{arch}.context_length"], int)
    assert info["general.parameter_count"] > 400_000_000  # a 0.5B model
    assert "tokenizer.ggml.tokens" in info and info["tokenizer.ggml.tokens"] is None


def test_pull_is_answered_honestly(qwen: Client) -> None:
    assert qwen.pull(QWEN).status == "success"
    statuses = [p.status for p in qwen.pull(f"{QWEN}:latest", stream=True)]
    assert statuses[-1] == "success" and len(statuses) == 2
    with pytest.raises(ResponseError) as err:
        qwen.pull("llama3.2")
    assert err.value.status_code == 404
    assert "not configured" in err.value.error and f"{QWEN}:latest" in err.value.error
    assert "llamaserve pull" in err.value.error and "qwen-0.5b" in err.value.error


def test_unknown_models_are_a_404_in_ollamas_shape(qwen: Client,
                                                   qwen_server: ServerProcess) -> None:
    for call in (lambda: qwen.chat(model="llama3.2", messages=COUNT),
                 lambda: qwen.generate(model="qwen2.5-coder:7b", prompt="Hi"),
                 lambda: qwen.show("nope:latest"),
                 lambda: qwen.embed(model="nomic-embed-text", input="x")):
        with pytest.raises(ResponseError) as err:
            call()
        assert err.value.status_code == 404 and "not found" in err.value.error
    r = httpx.post(f"{qwen_server.url}/api/chat", json={"model": "x", "messages": COUNT})
    assert r.status_code == 404 and r.json() == {"error": "model 'x' not found"}


BAD: list[tuple[str, Any, str]] = [  # path, body, words of the error
    ("/api/chat", {"messages": COUNT}, "model is required"),
    ("/api/chat", {"model": QWEN, "messages": "hi"}, "'messages' must be a list"),
    ("/api/chat", {"model": QWEN, "messages": [{"role": "user", "content": 5}]}, "content"),
    ("/api/chat", {"model": QWEN, "messages": [{"role": "robot", "content": "x"}]}, "role"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "options": {"temperature": "hot"}},
     "option 'temperature' must be a number"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "options": {"num_predict": 1.5}},
     "num_predict"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "options": {"num_ctx": 0}}, "num_ctx"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "options": []}, "'options'"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "format": "yaml"}, "format"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "think": "lots"}, "think"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "think": True},
     "does not support thinking"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "keep_alive": "forever"}, "keep_alive"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "stream": "yes"}, "stream"),
    ("/api/chat", {"model": QWEN, "messages": COUNT, "tools": [{"function": {}}]}, "tools[0]"),
    ("/api/chat", {"model": QWEN, "messages": [{"role": "user", "content": "x",
                                                "images": "abc"}]}, "images"),
    ("/api/chat", {"model": QWEN, "messages": [{"role": "assistant", "content": "",
                                                "tool_calls": [{"function": {
                                                    "name": "f", "arguments": [1]}}]}]},
     "arguments"),
    ("/api/generate", {"model": QWEN, "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ("/api/generate", {"model": QWEN, "prompt": "x", "raw": True, "system": "s"}, "raw"),
    ("/api/generate", {"model": QWEN, "prompt": "x", "context": [-1]}, "context"),
    ("/api/generate", {"model": QWEN, "prompt": "x", "raw": True, "images": ["aGk="]},
     "images"),
    ("/api/generate", {"model": QWEN, "prompt": 7}, "prompt"),
    ("/api/generate", {"model": QWEN, "prompt": "hello " * 5000}, "context length"),
    ("/api/embed", {"model": QWEN, "input": "x"}, "does not support embeddings"),
    ("/api/show", {}, "model is required"),
    ("/api/pull", {"model": QWEN, "stream": 1}, "stream"),
]


@pytest.mark.parametrize(("path", "body", "words"), BAD, ids=[f"{p}-{w}" for p, _, w in BAD])
def test_bad_bodies_are_a_400_in_ollamas_shape(qwen_server: ServerProcess, path: str,
                                               body: Any, words: str) -> None:
    r = httpx.post(f"{qwen_server.url}{path}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()
    assert set(error) == {"error"} and words in error["error"], error


def test_broken_json_and_wrong_methods(qwen_server: ServerProcess) -> None:
    for content in (b"{", b"[1]", b'{"model": "x", "model": "y"}', b"\xff"):
        r = httpx.post(f"{qwen_server.url}/api/chat", content=content, timeout=60)
        assert r.status_code == 400 and isinstance(r.json()["error"], str), r.text
    r = httpx.get(f"{qwen_server.url}/api/chat", timeout=60)
    assert r.status_code == 405 and isinstance(r.json()["error"], str)
    assert httpx.head(f"{qwen_server.url}/", timeout=60).status_code == 200
    assert httpx.get(f"{qwen_server.url}/api/version", timeout=60).json()["version"]


# -- without a model -------------------------------------------------------------------------

def test_names() -> None:
    assert split_tag("qwen2.5-coder:0.5b") == ("qwen2.5-coder", "0.5b")
    assert split_tag("host:8080/model") == ("host:8080/model", None)
    assert listed_name("smollm2") == "smollm2:latest" and listed_name("a:b") == "a:b"
    assert candidates("smollm2") == ["smollm2", "smollm2:latest"]
    assert candidates("smollm2:latest") == ["smollm2:latest", "smollm2"]


def test_options_map_onto_sampling() -> None:
    p = sampling_params({"temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1,
                         "seed": 42, "num_predict": 9, "stop": ["x"], "repeat_penalty": 1.2,
                         "repeat_last_n": -1, "presence_penalty": 0.5,
                         "frequency_penalty": -0.5, "typical_p": 0.2, "num_gpu": 99},
                        n_vocab=1000, n_ctx=256)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed, p.max_tokens, p.stop) == \
        (0.0, 0.5, 7, 0.1, 42, 9, ("x",))
    assert (p.repeat_penalty, p.penalty_last_n, p.presence_penalty, p.frequency_penalty) == \
        (1.2, 256, 0.5, -0.5)
    assert sampling_params({"num_predict": -1}, n_vocab=10, n_ctx=8).max_tokens is None
    many = [f"<stop{i}>" for i in range(20)]  # an editor plugin's: more than chat's 16
    assert sampling_params({"stop": many}, n_vocab=10, n_ctx=8).stop == tuple(many)
    assert sampling_params({"stop": "\n\n"}, n_vocab=10, n_ctx=8).stop == ("\n\n",)
    for bad, says in (([f"s{i}" for i in range(65)], "at most 64"), ([1], "list of strings")):
        with pytest.raises(APIError) as err:
            sampling_params({"stop": bad}, n_vocab=10, n_ctx=8)
        assert err.value.param == "options.stop" and says in err.value.message
        assert err.value.message.startswith("option 'stop'")
    assert sampling_params({"repeat_last_n": 0}, n_vocab=10, n_ctx=8).penalty_last_n == 0
    with pytest.raises(APIError) as err:
        sampling_params({"top_p": 3}, n_vocab=10, n_ctx=8)
    assert err.value.param == "options.top_p" and "option 'top_p'" in err.value.message
    assert response_format("json") == {"type": "json_object"}
    assert response_format({"type": "object"})["type"] == "json_schema"  # type: ignore[index]
    for ok in (None, 0, -1, 300.5, "5m", "1h30m", "0", "-1s", "1.5h"):
        check_keep_alive(ok)
    for bad in ("forever", "5", True, [], "5 m"):
        with pytest.raises(APIError):
            check_keep_alive(bad)



def test_api_keys_guard_ollamas_routes_and_answer_in_its_shape() -> None:
    from prometheus_client import CollectorRegistry

    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = Gate(app, ServerConfig(api_keys=("sk-1",)), HttpMetrics(CollectorRegistry()),
                GateState())

    def call(path: str, key: str | None) -> tuple[int, bytes]:
        sent: list[Any] = []
        headers = [(b"authorization", f"Bearer {key}".encode())] if key else []

        async def receive() -> Any:
            return {"type": "http.request", "body": b""}

        async def send(message: Any) -> None:
            sent.append(message)

        asyncio.run(gate({"type": "http", "path": path, "method": "POST", "headers": headers,
                          "client": ("127.0.0.1", 1)}, receive, send))
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    for path in ("/api/chat", "/api/tags", "/api/version"):
        status, body = call(path, None)
        assert status == 401 and set(json.loads(body)) == {"error"}, body
        assert call(path, "wrong")[0] == 401
        assert call(path, "sk-1") == (200, b"{}")
    assert reached == ["/api/chat", "/api/tags", "/api/version"]
