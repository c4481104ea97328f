"""/v1/responses over HTTP (JSON and SSE) and WebSocket on the real Qwen2.5-Coder-0.5B."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import lark
import openai
import pytest
from custom_grammars import APPLY_PATCH, lark_oracle
from openai import OpenAI
from websockets.sync.client import connect

from conftest import (
    ServerProcess,
    qwen_config,
    start_server,
    thinking_qwen_config,
    tiny_qwen_config,
)
from named_sse import named_events
from responses_protocol import check_events

WEATHER: list[Any] = [{"type": "function", "name": "get_weather",
                       "description": "Get the current weather for a city",
                       "parameters": {"type": "object", "properties": {
                           "city": {"type": "string"}}, "required": ["city"]}}]
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = start_server(qwen_config(), tmp_path_factory.mktemp("responses"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_create_returns_a_response_object(client: OpenAI) -> None:
    r = client.responses.create(model="x", input="Say hello.", temperature=0,
                                max_output_tokens=20, metadata={"run": "1"})
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.model == "qwen2.5-coder-0.5b-instruct" and r.metadata == {"run": "1"}
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert r.output_text and r.output_text == item.content[0].text  # type: ignore[union-attr]
    assert r.usage is not None and r.usage.input_tokens > 5 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.incomplete_details is None


def sse_events(server: ServerProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    return named_events(f"{server.base_url}/responses", {**body, "stream": True})


def test_stream_event_order_and_text(server: ServerProcess, client: OpenAI) -> None:
    events = sse_events(server, {"model": "x", "input": "Name three colors.", "temperature": 0,
                                 "max_output_tokens": 40})
    kinds = [e["type"] for e in events]
    n_deltas = kinds.count("response.output_text.delta")
    assert n_deltas >= 2
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * n_deltas,
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert text == done["text"]
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == text
    # the SDK reads the same stream
    sdk_events = list(client.responses.create(model="x", input="Name three colors.",
                                              temperature=0, max_output_tokens=40, stream=True))
    assert [e.type for e in sdk_events] == kinds


def test_function_tool_call_is_a_function_call_item(server: ServerProcess,
                                                    client: OpenAI) -> None:
    r = client.responses.create(model="x", input="What is the weather in Paris?",
                                tools=WEATHER, temperature=0)
    (item,) = r.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and json.loads(item.arguments) == {"city": "Paris"}
    events = sse_events(server, {"model": "x", "input": "What is the weather in Paris?",
                                 "tools": WEATHER, "temperature": 0})
    kinds = [e["type"] for e in events]
    assert kinds[2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                         "response.function_call_arguments.done", "response.output_item.done",
                         "response.completed"]
    assert json.loads(events[-2]["item"]["arguments"]) == {"city": "Paris"}
    # the result goes back as a function_call_output item
    follow = client.responses.create(
        model="x", previous_response_id=r.id, temperature=0, max_output_tokens=40,
        tool_choice="none", tools=WEATHER,
        input=[{"type": "function_call_output", "call_id": item.call_id,
                "output": "18 degrees Celsius and sunny"}])
    assert "18" in follow.output_text


def test_previous_response_id_recalls_a_fact(client: OpenAI) -> None:
    first = client.responses.create(model="x", temperature=0, max_output_tokens=20,
                                    input="My name is Zorblax. Just say hi.")
    second = client.responses.create(model="x", temperature=0, max_output_tokens=20,
                                     input="What is my name?", previous_response_id=first.id)
    assert "Zorblax" in second.output_text
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_stored_responses_get_delete_and_404(server: ServerProcess, client: OpenAI) -> None:
    r = client.responses.create(model="x", input="Say yes.", temperature=0, max_output_tokens=5)
    assert client.responses.retrieve(r.id).output_text == r.output_text
    client.responses.delete(r.id)
    for call in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert isinstance(err.value.body, dict) and err.value.body["code"] == "not_found"
    unstored = client.responses.create(model="x", input="Say no.", store=False,
                                       max_output_tokens=5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError, match="not found"):
        client.responses.create(model="x", input="x", previous_response_id="resp_nope")


def test_max_output_tokens_gives_incomplete(server: ServerProcess, client: OpenAI) -> None:
    r = client.responses.create(model="x", input="Write a long story about a dragon.",
                                temperature=0, max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    events = sse_events(server, {"model": "x", "input": "Write a long story.",
                                 "max_output_tokens": 5})
    assert events[-1]["type"] == "response.incomplete"


def test_json_schema_text_format(client: OpenAI) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = client.responses.create(model="x", input="Describe Paris.", temperature=0,
                                max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "city",
                                                 "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "tools": [{"type": "teleport"}]}, "tools[0].type"),
    ({"input": [{"type": "hologram"}]}, "input[0].type"),
    ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": 42}, "input"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    # a custom tool's grammar this server cannot read or enforce (engine/constraints/lark_rules.py)
    ({"input": "x", "tools": [{"type": "custom", "name": "t", "format": {
        "type": "grammar", "syntax": "lark", "definition": "start: missing"}}]},
     "tools[0].format"),
    ({"input": "x", "tools": [{"type": "custom", "name": "t", "format": {
        "type": "grammar", "syntax": "regex", "definition": "a(?=b)"}}]}, "tools[0].format"),
    ({"input": "x", "tools": [{"type": "custom", "name": "t", "format": {
        "type": "grammar", "syntax": "peg", "definition": "x"}}]}, "tools[0].format"),
    ({"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": [
        {"type": "custom", "name": "t", "format": {"type": "grammar", "syntax": "lark",
                                                   "definition": 5}}]}]},
     "tools[0].tools[0].format"),
])
def test_bad_requests_are_400(server: ServerProcess, body: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{server.base_url}/responses", json={"model": "x", **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


# -- WebSocket ----------------------------------------------------------------------------
def ws_url(server: ServerProcess) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/responses"


def until_done(conn: Any) -> list[Any]:
    events = []
    for event in conn:
        events.append(event)
        if event.type in TERMINAL:
            return events
    raise AssertionError("connection closed before the response ended")


def test_websocket_two_turns_recall_and_reuse_the_prefix(client: OpenAI) -> None:
    with client.responses.connect() as conn:
        conn.response.create(model="x", temperature=0, max_output_tokens=10, store=False,
                             instructions="You are a terse assistant.",
                             input="Remember: the secret word is BANANA. Reply OK.")
        first = until_done(conn)[-1]
        assert first.type == "response.completed"
        conn.response.create(model="x", temperature=0, max_output_tokens=10, store=False,
                             instructions="You are a terse assistant.",
                             input="What is the secret word?",
                             previous_response_id=first.response.id)
        events = until_done(conn)
        second = events[-1].response
        assert "BANANA" in second.output_text.upper()
        # the second turn did not prefill the first again
        assert second.usage.input_tokens_details.cached_tokens >= \
            first.response.usage.input_tokens
        assert [e.sequence_number for e in events] == list(range(len(events)))


def test_websocket_errors_keep_the_socket_usable(server: ServerProcess) -> None:
    with connect(ws_url(server)) as ws:
        ws.send("{not json")
        assert json.loads(ws.recv())["error"]["code"] == "invalid_json"
        ws.send(json.dumps({"type": "response.cancel"}))
        assert json.loads(ws.recv())["error"]["code"] == "unknown_event_type"
        ws.send(json.dumps({"type": "response.create", "model": "x", "input": 42}))
        error = json.loads(ws.recv())
        assert error["type"] == "error" and error["error"]["param"] == "input"
        ws.send(json.dumps({"type": "response.create", "model": "x", "input": "x",
                            "previous_response_id": "resp_unknown"}))
        assert json.loads(ws.recv())["error"]["code"] == "previous_response_not_found"
        ws.send(json.dumps({"type": "response.create", "model": "x", "input": "Count to 50.",
                            "max_output_tokens": 60, "temperature": 0}))
        ws.send(json.dumps({"type": "response.create", "model": "x", "input": "Too soon"}))
        kinds = []
        while True:
            event = json.loads(ws.recv())
            kinds.append(event["type"] if event["type"] != "error"
                         else event["error"]["code"])
            if event["type"] in TERMINAL[:3]:
                break
        assert "response_in_progress" in kinds and kinds[-1] in TERMINAL[:2]
        ws.send(json.dumps({"type": "response.create", "model": "x", "input": "Say OK.",
                            "max_output_tokens": 5}))
        while (event := json.loads(ws.recv()))["type"] not in TERMINAL:
            pass
        assert event["type"] in ("response.completed", "response.incomplete")


def test_generate_false_warms_the_prefix(client: OpenAI) -> None:
    instructions = "You answer questions about this list. " + " ".join(
        f"Item {i} is a {['red', 'green', 'blue'][i % 3]} box." for i in range(60))
    with client.responses.connect() as conn:
        conn.response.create(model="x", instructions=instructions, input="Ready?",
                             generate=False, store=False)
        warm = until_done(conn)
        assert warm[-1].type == "response.completed" and warm[-1].response.output == []
        assert not any(e.type == "response.output_text.delta" for e in warm)
        conn.response.create(model="x", instructions=instructions, input="What color is item 4?",
                             previous_response_id=warm[-1].response.id, temperature=0,
                             max_output_tokens=10, store=False)
        answer = until_done(conn)[-1].response
        # all of the warmed prompt but its "<|im_start|>assistant\n" generation prompt
        assert answer.usage.input_tokens_details.cached_tokens >= \
            warm[-1].response.usage.input_tokens - 3 > 500


def test_closing_the_socket_cancels_the_response(server: ServerProcess) -> None:
    before = server.metrics().get("llamaserve_sequences_finished_total{reason=cancelled}", 0)
    with connect(ws_url(server)) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "x", "temperature": 0,
                            "input": "Count from 1 to 1000, comma separated.",
                            "max_output_tokens": 2000}))
        while json.loads(ws.recv())["type"] != "response.output_text.delta":
            pass
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = server.metrics()
        if m.get("llamaserve_sequences_finished_total{reason=cancelled}", 0) > before:
            break
        time.sleep(0.1)
    assert m["llamaserve_sequences_finished_total{reason=cancelled}"] == before + 1
    assert m["llamaserve_requests_running"] == 0


def test_websocket_from_another_server_config(tmp_path: Any) -> None:
    """Connection history is bounded by server.websocket_history."""
    cfg = qwen_config()
    cfg["server"] = {**cfg.get("server", {}), "websocket_history": 1}
    s = start_server(cfg, tmp_path)
    try:
        c = OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)
        with c.responses.connect() as conn:
            ids = []
            for text in ("One.", "Two."):
                conn.response.create(model="x", input=text, max_output_tokens=3, store=False)
                ids.append(until_done(conn)[-1].response.id)
            conn.response.create(model="x", input="x", previous_response_id=ids[0],
                                 store=False, max_output_tokens=3)
            (event,) = until_done(conn)
            assert event.type == "error" and event.error.code == "previous_response_not_found"
    finally:
        s.stop()


# -- the streaming state machine and every tool kind, over SSE and WebSocket -------------
CODEX_LIKE_TOOLS: list[Any] = [
    *WEATHER,
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files",
     "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH}},
    {"type": "local_shell"},
    {"type": "namespace", "name": "notes", "description": "Note taking",
     "tools": [{"type": "function", "name": "add_note", "parameters": {
         "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]},
    {"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "image_generation"}, {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1"},
]
STREAMS: dict[str, dict[str, Any]] = {
    "text": {"input": "Name three colors.", "max_output_tokens": 30},
    "cut text": {"input": "Write a long story about a dragon.", "max_output_tokens": 6},
    "function call": {"input": "What is the weather in Paris?", "tools": CODEX_LIKE_TOOLS,
                      "tool_choice": {"type": "function", "name": "get_weather"}},
    "custom tool call": {"input": "Add a file hello.txt containing hi.",
                         "tools": CODEX_LIKE_TOOLS,
                         "tool_choice": {"type": "custom", "name": "apply_patch"},
                         "max_output_tokens": 60},
    "local shell call": {"input": "List the files in /tmp.", "tools": CODEX_LIKE_TOOLS,
                         "tool_choice": {"type": "local_shell"}, "max_output_tokens": 40},
    "namespaced call": {"input": "Remember: buy milk.", "tools": CODEX_LIKE_TOOLS[3:],
                        "tool_choice": "required", "max_output_tokens": 40},
}


def ws_events(server: ServerProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    with connect(ws_url(server)) as ws:
        ws.send(json.dumps({"type": "response.create", **body}))
        events = []
        while True:
            event = json.loads(ws.recv(timeout=120))
            events.append(event)
            if event["type"] in TERMINAL:
                return events


@pytest.mark.parametrize("name", list(STREAMS))
def test_streams_follow_the_state_machine_over_sse_and_websocket(
        server: ServerProcess, name: str) -> None:
    body = {"model": "x", "temperature": 0, **STREAMS[name]}
    sse = check_events(sse_events(server, body))
    ws = check_events(ws_events(server, body))
    kinds = [[i["type"] for i in r["output"]] for r in (sse, ws)]
    assert kinds[0] == kinds[1], kinds  # the same model answer, whichever transport
    expected = {"function call": "function_call", "custom tool call": "custom_tool_call",
                "local shell call": "local_shell_call", "namespaced call": "function_call"}
    if name in expected:
        for r in (sse, ws):
            item = r["output"][-1]
            assert item["type"] == expected[name], r["output"]
            if name == "custom tool call":  # a patch, as the tool's grammar has it
                assert item["name"] == "apply_patch" and isinstance(item["input"], str)
                lark.Lark(lark_oracle(APPLY_PATCH)).parse(item["input"])
            if name == "local shell call":
                assert item["action"]["type"] == "exec" and item["action"]["command"]
            if name == "namespaced call":
                assert (item["namespace"], item["name"]) == ("notes", "add_note")
    if name == "cut text":
        assert sse["status"] == "incomplete" and sse["output"][-1]["status"] == "incomplete"


def test_sdk_stream_snapshot_holds_the_arguments_once(client: OpenAI) -> None:
    """The OpenAI SDK's responses.stream() appends argument deltas onto the added item."""
    snapshots = []
    with client.responses.stream(model="x", input="What is the weather in Rome?",
                                 tools=WEATHER, temperature=0,
                                 tool_choice={"type": "function", "name": "get_weather"}
                                 ) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                snapshots.append(event.snapshot)
        final = stream.get_final_response()
    (item,) = final.output
    assert item.type == "function_call"
    assert snapshots and snapshots[-1] == item.arguments
    assert json.loads(snapshots[-1]) == {"city": "Rome"}


def test_one_conversation_is_one_prompt_through_chat_and_responses(
        server: ServerProcess, client: OpenAI) -> None:
    """The same conversation built through chat messages, Responses input items and
    previous_response_id history renders to the same tokens: the second request
    finds all but its last token in the prefix cache."""
    args = '{"city": "Paris"}'
    system = "You are a weather bot. " * 8
    chat_messages: list[Any] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
        {"role": "user", "content": "Thanks! Is it warm?"}]
    items: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": args},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C and sunny"},
        {"role": "user", "content": [{"type": "input_text", "text": "Thanks! Is it warm?"}]}]
    chat_tools = [{"type": "function", "function": {k: v for k, v in WEATHER[0].items()
                                                     if k != "type"}}]
    chat = client.chat.completions.create(model="x", messages=chat_messages, tools=chat_tools,
                                          max_tokens=1, temperature=0)
    resp = client.responses.create(model="x", instructions=system, input=items, tools=WEATHER,
                                   max_output_tokens=1, temperature=0)
    assert chat.usage is not None and resp.usage is not None
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.input_tokens_details.cached_tokens == resp.usage.input_tokens - 1
    # the same through previous_response_id: a stored turn with the call, then its output
    first = client.responses.create(
        model="x", instructions=system, input="Weather in Lyon?", tools=WEATHER,
        temperature=0, tool_choice={"type": "function", "name": "get_weather"})
    (call,) = first.output
    assert call.type == "function_call"
    second = client.responses.create(
        model="x", instructions=system, previous_response_id=first.id, tools=WEATHER,
        max_output_tokens=1, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "9 C"}])
    again = client.chat.completions.create(
        model="x", tools=chat_tools, max_tokens=1, temperature=0, messages=[
            {"role": "system", "content": system},
            {"role": "user", "content": "Weather in Lyon?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call.call_id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "9 C"}])
    assert again.usage is not None and second.usage is not None
    assert again.usage.prompt_tokens == second.usage.input_tokens
    assert again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_codex_style_inputs_are_accepted(server: ServerProcess) -> None:
    """Items Codex sends back: custom and shell calls with their outputs, output given as
    content parts, hosted tools' call items, images without a projector, reasoning."""
    body = {"model": "x", "max_output_tokens": 5, "temperature": 0, "store": False,
            "tools": CODEX_LIKE_TOOLS, "input": [
                {"role": "user", "content": [
                    {"type": "input_text", "text": "Fix the bug."},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [
                    {"type": "summary_text", "text": "Look at the file first."}]},
                {"type": "local_shell_call", "id": "lsh_1", "call_id": "c1", "status":
                 "completed", "action": {"type": "exec", "command": ["cat", "a.py"],
                                         "env": {}}},
                {"type": "local_shell_call_output", "call_id": "c1", "output": "print(1)"},
                {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch",
                 "input": "*** Begin Patch\n*** End Patch"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"},
                {"type": "function_call", "call_id": "c3", "name": "add_note",
                 "namespace": "notes", "arguments": '{"text": "x"}'},
                {"type": "function_call_output", "call_id": "c3", "output": [
                    {"type": "input_text", "text": "saved"}]},
                {"type": "web_search_call", "id": "ws_1", "status": "completed",
                 "action": {"type": "search", "query": "x"}},
                {"type": "item_reference", "id": "msg_0"},
                {"role": "user", "content": "Thanks."}]}
    r = httpx.post(f"{server.base_url}/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("completed", "incomplete")


def test_reasoning_encrypted_content_round_trips_without_a_store(tmp_path: Any) -> None:
    """A template that opens a <think> block makes every answer start as reasoning; with
    include=reasoning.encrypted_content the reasoning item carries a sealed copy, which,
    sent back alone on a stateless turn, is opened and rendered again (a forged token is
    ignored)."""
    cfg = thinking_qwen_config()
    cfg["server"] = {**cfg.get("server", {}), "reasoning_key": "k" * 32}
    s = start_server(cfg, tmp_path)
    try:
        c = OpenAI(base_url=s.base_url, api_key="unused", max_retries=0, timeout=120)
        r = c.responses.create(model="x", input="What is 2+2?", temperature=0,
                               max_output_tokens=24, store=False,
                               include=["reasoning.encrypted_content"])
        (reasoning,) = [i for i in r.output if i.type == "reasoning"]
        text = reasoning.content[0].text  # type: ignore[index]
        token = reasoning.encrypted_content
        assert text and token and text not in token  # opaque
        back: list[Any] = [{"type": "reasoning", "id": reasoning.id, "summary": [],
                            "encrypted_content": token},
                           {"role": "assistant", "content": "4"},
                           {"role": "user", "content": "And 3+3?"}]
        forged = [{**back[0], "encrypted_content": token[:-6] + "AAAAAA"}, *back[1:]]
        plain = c.responses.create(model="x", input=back[1:], temperature=0,
                                   max_output_tokens=1, store=False)
        turn = c.responses.create(model="x", input=back, temperature=0, max_output_tokens=1,
                                  store=False)
        bad = c.responses.create(model="x", input=forged, temperature=0, max_output_tokens=1,
                                 store=False)
        assert turn.usage and plain.usage and bad.usage
        n_text = len(httpx.post(f"{s.base_url}/tokenize", json={"prompt": text},
                                timeout=30).json()["tokens"])
        # the opened reasoning is in the prompt again; the forged token added nothing
        assert turn.usage.input_tokens >= plain.usage.input_tokens + n_text - 2
        assert bad.usage.input_tokens == plain.usage.input_tokens
    finally:
        s.stop()


def test_silent_streams_carry_keepalives(tmp_path: Any) -> None:
    """A long prefill sends SSE comments before the first token, on chat and Responses
    (the random-weight model: a prefill in 16-token steps of ~2,300 tokens lasts well past
    the keepalive interval, and a real model's quality is not the point)."""
    cfg = tiny_qwen_config(n_batch=16, n_ubatch=16)  # small steps: the prefill takes a while
    cfg["server"] = {**cfg.get("server", {}), "keepalive_seconds": 0.02}
    s = start_server(cfg, tmp_path)
    try:
        def long(word: str) -> str:  # a new prompt each time: no prefix-cache hit
            return f"Here is a {word} list. " + " ".join(f"Item {i} is {word} {i}."
                                                          for i in range(200))

        for path, body in (("/chat/completions", {"messages": [
                                {"role": "user", "content": long("red")}], "max_tokens": 2}),
                           ("/responses", {"input": long("blue"), "max_output_tokens": 2})):
            lines = []
            with httpx.stream("POST", f"{s.base_url}{path}", timeout=120,
                              json={"model": "x", "stream": True, **body}) as r:
                lines = [line for line in r.iter_lines() if line]
            # two tokens are generated: the only silence is the prefill
            assert ": keep-alive" in lines, (path, lines[:5])
            assert lines[-1] in ("data: [DONE]",) or "response.completed" in lines[-1] \
                or "response.incomplete" in lines[-1]
    finally:
        s.stop()
