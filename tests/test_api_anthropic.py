"""The Anthropic Messages API on the real Qwen2.5-Coder-0.5B, through the anthropic SDK."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from openai import OpenAI

from conftest import ServerProcess, qwen_config, start_server, thinking_qwen_config
from named_sse import named_events

WEATHER: list[Any] = [{"name": "get_weather", "description": "Get the current weather for a city",
                       "input_schema": {"type": "object", "properties": {
                           "city": {"type": "string"}}, "required": ["city"]}}]
GREEDY = {"temperature": 0}  # this SDK version has no temperature argument


@pytest.fixture(scope="module")
def client(qwen_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=qwen_server.url, api_key="unused", max_retries=0,
                               timeout=120)


def test_plain_message_and_count_tokens(client: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": "Say hello in five words."}]
    r = client.messages.create(model="x", max_tokens=20, messages=messages, extra_body=GREEDY,
                               system="You are terse.", metadata={"user_id": "u1"})
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.model == "qwen2.5-coder-0.5b-instruct"
    assert r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens")
    counted = client.messages.count_tokens(model="x", messages=messages, system="You are terse.")
    assert counted.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)


def test_streamed_text_joins_to_the_final_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="x", max_tokens=30, extra_body=GREEDY,
                                messages=[{"role": "user", "content": "Name three colors."}]
                                ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.output_tokens > 0 and final.stop_reason in ("end_turn", "max_tokens")


def test_raw_stream_follows_anthropics_event_sequence(qwen_server: ServerProcess) -> None:
    events = [e for e in named_events(f"{qwen_server.url}/v1/messages", {
        "model": "x", "max_tokens": 40, "temperature": 0, "stream": True, "tools": WEATHER,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}]})
        if e["type"] != "ping"]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    open_index = None
    for e in events[1:-2]:  # blocks open, get deltas, close, in order, never interleaved
        if e["type"] == "content_block_start":
            assert open_index is None
            open_index = e["index"]
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_index
        else:
            assert e["type"] == "content_block_stop" and e["index"] == open_index
            open_index = None
    tool = [e for e in events if e["type"] == "content_block_start"
            and e["content_block"]["type"] == "tool_use"]
    assert tool, kinds  # the 0.5B model calls the tool for this question
    partial = "".join(e["delta"]["partial_json"] for e in events
                      if e["type"] == "content_block_delta"
                      and e["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_tool_round_trip(client: anthropic.Anthropic) -> None:
    question: Any = {"role": "user", "content": "What is the weather in Paris?"}
    r = client.messages.create(model="x", max_tokens=60, extra_body=GREEDY, tools=WEATHER,
                               messages=[question])
    assert r.stop_reason == "tool_use"
    (call,) = [b for b in r.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    assert call.id.startswith("toolu_")
    follow = client.messages.create(
        model="x", max_tokens=40, extra_body=GREEDY, tools=WEATHER, tool_choice={"type": "none"},
        messages=[question, {"role": "assistant", "content": r.content},  # type: ignore[list-item]
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                "content": "18 degrees Celsius and sunny"}]}])
    assert follow.stop_reason in ("end_turn", "max_tokens")
    assert "18" in "".join(b.text for b in follow.content if b.type == "text")


def test_forced_tool_gives_schema_valid_input(client: anthropic.Anthropic) -> None:
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
        r = client.messages.create(model="x", max_tokens=40, extra_body=GREEDY, tools=WEATHER,
                                   tool_choice=choice,  # type: ignore[arg-type]
                                   messages=[{"role": "user", "content": "Tell me a joke."}])
        (call,) = [b for b in r.content if b.type == "tool_use"]
        jsonschema.validate(call.input, WEATHER[0]["input_schema"])
        assert r.stop_reason == "tool_use"


def test_stop_sequences(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model="x", max_tokens=60, extra_body=GREEDY, stop_sequences=["3"],
                               messages=[{"role": "user", "content": "Count from 1 to 10."}])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "3"
    assert "3" not in r.content[0].text  # type: ignore[union-attr]


def test_one_conversation_is_one_prompt_through_anthropic_and_chat(
        qwen_server: ServerProcess, client: anthropic.Anthropic) -> None:
    system = "You are a weather bot. " * 6
    anth: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "2 C"}, {"type": "text", "text": "Cold?"}]}]
    chat: list[Any] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "toolu_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "2 C"},
        {"role": "user", "content": "Cold?"}]
    oai = OpenAI(base_url=qwen_server.base_url, api_key="unused", max_retries=0)
    c = oai.chat.completions.create(model="x", messages=chat, max_tokens=1, temperature=0,
                                    tools=[{"type": "function", "function": {
                                        "name": "get_weather", "description":
                                        WEATHER[0]["description"],
                                        "parameters": WEATHER[0]["input_schema"]}}])
    a = client.messages.create(model="x", max_tokens=1, extra_body=GREEDY, system=system,
                               tools=WEATHER, messages=anth)
    assert c.usage is not None
    total = a.usage.input_tokens + (a.usage.cache_read_input_tokens or 0)
    assert total == c.usage.prompt_tokens
    assert a.usage.cache_read_input_tokens == total - 1  # identical tokens but the last


@pytest.mark.parametrize(("body", "fragment"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tool_choice": {"type": "sometimes"}}, "tool_choice"),
])
def test_errors_have_anthropics_shape(qwen_server: ServerProcess, body: dict[str, Any],
                                      fragment: str) -> None:
    r = httpx.post(f"{qwen_server.url}/v1/messages", json={"model": "x", **body}, timeout=30)
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert fragment in err["error"]["message"]
    client = anthropic.Anthropic(base_url=qwen_server.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="x", max_tokens=0, messages=[
            {"role": "user", "content": "x"}])
    missing = httpx.post(f"{qwen_server.url}/v1/messages/nope", json={}, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_x_api_key_is_accepted(tmp_path: Path) -> None:
    cfg = qwen_config()
    cfg["server"] = {**cfg.get("server", {}), "api_key": "sekret"}
    s = start_server(cfg, tmp_path)
    try:
        ok = anthropic.Anthropic(base_url=s.url, api_key="sekret", max_retries=0)
        assert ok.messages.count_tokens(model="x", messages=[
            {"role": "user", "content": "hi"}]).input_tokens > 0
        bad = anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as err:
            bad.messages.create(model="x", max_tokens=5, messages=[
                {"role": "user", "content": "hi"}])
        assert isinstance(err.value.body, dict)
        assert err.value.body["error"]["type"] == "authentication_error"
    finally:
        s.stop()


def test_output_config_json_schema(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    r = client.messages.create(model="x", max_tokens=40, extra_body=GREEDY,
                               output_config={"format": {"type": "json_schema",
                                                         "schema": schema}},
                               messages=[{"role": "user", "content": "Where is the Louvre?"}])
    jsonschema.validate(json.loads(r.content[0].text), schema)  # type: ignore[union-attr]


def test_reasoning_comes_back_as_signed_thinking_blocks(tmp_path: Path) -> None:
    s = start_server(thinking_qwen_config(), tmp_path)
    try:
        c = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=120)
        ask: Any = [{"role": "user", "content": "What is 2+2?"}]
        r = c.messages.create(model="x", max_tokens=30, extra_body=GREEDY, messages=ask,
                              thinking={"type": "enabled", "budget_tokens": 1024})
        block = r.content[0]
        assert block.type == "thinking" and block.thinking and block.signature
        with c.messages.stream(model="x", max_tokens=30, extra_body=GREEDY, messages=ask
                               ) as stream:
            kinds = {e.delta.type for e in stream if e.type == "content_block_delta"}
            final = stream.get_final_message()
        assert {"thinking_delta", "signature_delta"} <= kinds
        assert final.content[0].type == "thinking"
        assert final.content[0].thinking == block.thinking  # type: ignore[union-attr]
        # sent back, the thinking is rendered into the prompt again
        back: Any = [*ask, {"role": "assistant", "content": [b.model_dump() for b in r.content]},
                     {"role": "user", "content": "And 3+3?"}]
        plain: Any = [*ask, {"role": "assistant", "content": "4"},
                      {"role": "user", "content": "And 3+3?"}]
        n_back = c.messages.count_tokens(model="x", messages=back).input_tokens
        n_plain = c.messages.count_tokens(model="x", messages=plain).input_tokens
        assert n_back > n_plain + 5
    finally:
        s.stop()


# --- Claude Code's request shape, on the tiny Qwen-tokenizer model (tests/make_tiny_model.py):
# only the protocol and the prompt's make-up count here, never the (random) text

CLAUDE_CODE_BETAS = ("claude-code-20250219,interleaved-thinking-2025-05-14,"
                     "context-management-2025-06-27,mid-conversation-system-2026-04-07,"
                     "effort-2025-11-24,advanced-tool-use-2025-11-20")


@pytest.fixture(scope="module")
def tiny(tiny_qwen_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=tiny_qwen_server.url, api_key="unused", max_retries=0,
                               timeout=120)


def _sdk_args(body: dict[str, Any], named: tuple[str, ...] = (
        "messages", "system", "tools", "metadata", "thinking")) -> dict[str, Any]:
    """A raw body as the SDK's arguments: known fields by name, the rest in extra_body."""
    return {"model": "claude-code-default", **{k: body[k] for k in named if k in body},
            "extra_body": {k: v for k, v in body.items()
                           if k not in (*named, "stream", "max_tokens")},
            "extra_headers": {"anthropic-beta": CLAUDE_CODE_BETAS}}


def _count(client: anthropic.Anthropic, body: dict[str, Any]) -> int:
    args = _sdk_args(body, ("messages", "system", "tools", "thinking"))  # no metadata here
    return client.messages.count_tokens(**args).input_tokens


def test_claude_codes_request_is_served_and_counted(tiny: anthropic.Anthropic) -> None:
    from test_anthropic_request import CLAUDE_CODE_SHAPE
    body = CLAUDE_CODE_SHAPE
    with tiny.messages.stream(max_tokens=body["max_tokens"], **_sdk_args(body)) as stream:
        final = stream.get_final_message()
    # max_tokens 32000 is far beyond the 2,048-token context: cut to the room, not a 400
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0
    prompt = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    assert _count(tiny, body) == prompt  # count_tokens takes the same body
    # what is in the prompt: the mid-conversation system turn is; the billing header, a
    # deferred tool no search loaded and a server tool are not
    msgs, tools = body["messages"], body["tools"]
    assert _count(tiny, {**body, "messages": msgs[:-1]}) < prompt
    assert _count(tiny, {**body, "system": body["system"][1:]}) == prompt
    assert _count(tiny, {**body, "tools": [t for t in tools if t["name"] != "Monitor"]}) \
        == prompt
    assert _count(tiny, {**body, "tools": [t for t in tools if t["name"] != "web_search"]}) \
        == prompt
    assert _count(tiny, {**body, "tools": [t for t in tools if t["name"] != "CronCreate"]}) \
        < prompt


def _words_for(client: anthropic.Anthropic, tokens: int) -> str:
    """A user message of about ``tokens`` prompt tokens (template included)."""
    def count(n: int) -> int:
        return _count(client, {"messages": [{"role": "user", "content": "tick " * n}]})
    base, per = count(100), (count(300) - count(100)) / 200
    return "tick " * (100 + round((tokens - base) / per))


def test_max_tokens_beyond_the_room_left_ends_at_the_context(tiny: anthropic.Anthropic) -> None:
    text = _words_for(tiny, 2040)
    r = tiny.messages.create(model="x", max_tokens=32000,
                             messages=[{"role": "user", "content": text}])
    prompt = r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
    assert 2000 < prompt < 2048
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2048 - prompt
    # a prompt that does not fit is still refused, naming the setting to raise
    with pytest.raises(anthropic.BadRequestError) as err:
        tiny.messages.create(model="x", max_tokens=100, messages=[
            {"role": "user", "content": text + "tick " * 100}])
    assert "model.n_ctx" in str(err.value) and err.value.body["type"] == "error"


def test_the_stream_beats_while_a_long_prompt_prefills(tiny_qwen_server: ServerProcess) -> None:
    """~1,800 prompt tokens (a unique start: none cached), behind another prompt as long
    that came first: alone, the tiny model's prefill ends 80-90 ms after message_start and
    now and then before the first 50 ms beat; behind the other, it takes twice that."""
    def long_prompt() -> dict[str, Any]:
        return {"model": "x", "max_tokens": 4,
                "messages": [{"role": "user", "content": f"{uuid.uuid4().hex} " + "tock " * 900}]}

    first = threading.Thread(target=httpx.post, args=(f"{tiny_qwen_server.url}/v1/messages",),
                             kwargs={"json": long_prompt(), "timeout": 60})
    first.start()
    time.sleep(0.02)
    events = named_events(f"{tiny_qwen_server.url}/v1/messages",
                          {**long_prompt(), "stream": True})
    first.join()
    kinds = [e["type"] for e in events]
    first_block = kinds.index("content_block_start") if "content_block_start" in kinds \
        else kinds.index("message_delta")
    assert kinds[0] == "message_start" and "ping" in kinds[1:first_block], kinds[:10]
