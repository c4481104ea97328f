"""Responses API events built from parsed deltas, with no model: every item type, fed
through the real parser in any chunking, against the streaming state machine."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from api.responses.events import ResponseBuilder
from api.responses.request import parse_request
from api.web.params import Body
from conftest import load_config
from parsers.message_stream import MessageStream
from parsers.response_schema import stream_layout
from responses_protocol import check_events

HERMES = stream_layout(load_config("qwen2.5-coder-0.5b.json")["model"]["response_schema"])
QWEN35 = stream_layout(load_config("qwen3.5-0.8b.json")["model"]["response_schema"])
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "get_weather",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"type": "custom", "name": "apply_patch", "description": "Edit files",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    {"type": "local_shell"},
    {"type": "namespace", "name": "crm", "description": "CRM", "tools": [
        {"type": "function", "name": "find", "parameters": {"type": "object"}}]},
    {"type": "web_search"},
]


def call(name: str, args: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


TEXTS = {
    "text then every call kind": "Let me look.\n" + "\n".join([
        call("get_weather", {"city": "Rome"}),
        call("apply_patch", {"input": "*** Begin Patch\n*** End Patch"}),
        call("local_shell", {"command": ["ls", "-la"], "workdir": "/tmp"}),
        call("crm__find", {"q": "x"})]),
    "plain text": "Hello there, friend.",
    "only a call": call("get_weather", {"city": "Oslo"}),
}


def build(text: str, chunks: list[str], finish: str = "stop",
          layout: Any = HERMES) -> list[dict[str, Any]]:
    req = parse_request(Body({"input": "hi", "tools": TOOLS}))
    tools = req.chat_body["tools"]
    builder = ResponseBuilder("resp_1", "m", req.echo, req.offered)
    parser = MessageStream(layout, tools=tools)
    events = builder.start()
    for c in chunks:
        events += builder.add(parser.feed(c))
    events += builder.add(parser.finish())
    events += builder.finish(finish, {"input_tokens": 1})
    assert "".join(c for c in chunks) == text
    return events


def chunkings(text: str, seed: str) -> list[list[str]]:
    rng = random.Random(seed)
    out = [[text], list(text)]
    for _ in range(10):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 20))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


@pytest.mark.parametrize("name", list(TEXTS))
def test_any_chunking_gives_a_valid_stream_with_the_same_output(name: str) -> None:
    outputs = []
    for chunks in chunkings(TEXTS[name], name):
        response = check_events(build(TEXTS[name], chunks))
        outputs.append([{k: v for k, v in item.items() if k not in ("id", "call_id")}
                        for item in response["output"]])
    assert all(o == outputs[0] for o in outputs)


def test_every_call_kind_becomes_its_own_item_type() -> None:
    response = check_events(build(TEXTS["text then every call kind"],
                                  [TEXTS["text then every call kind"]]))
    out = response["output"]
    assert [i["type"] for i in out] == ["message", "function_call", "custom_tool_call",
                                        "local_shell_call", "function_call"]
    assert out[0]["content"][0]["text"] == "Let me look."
    assert json.loads(out[1]["arguments"]) == {"city": "Rome"} and out[1]["name"] == "get_weather"
    assert out[2]["name"] == "apply_patch" and out[2]["input"] == "*** Begin Patch\n*** End Patch"
    assert out[3]["action"] == {"type": "exec", "command": ["ls", "-la"], "env": {},
                                "working_directory": "/tmp"}
    assert (out[4]["name"], out[4]["namespace"]) == ("find", "crm")
    assert all(i["status"] == "completed" for i in out)


def test_an_added_item_is_never_changed_after_it_was_sent() -> None:
    """The OpenAI SDK appends argument deltas onto the added item: it must be empty."""
    events = build(TEXTS["only a call"], list(TEXTS["only a call"]))
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress"
    snapshot = {"arguments": ""}
    for e in events:
        if e["type"] == "response.function_call_arguments.delta":
            snapshot["arguments"] += e["delta"]
    assert json.loads(snapshot["arguments"]) == {"city": "Oslo"}


def test_a_call_is_announced_before_its_arguments_end() -> None:
    text = TEXTS["only a call"]
    req = parse_request(Body({"input": "hi", "tools": TOOLS}))
    builder = ResponseBuilder("resp_1", "m", req.echo, req.offered)
    parser = MessageStream(HERMES, tools=req.chat_body["tools"])
    builder.start()
    events = builder.add(parser.feed(text[: text.index("Oslo")]))
    assert [e["type"] for e in events][:1] == ["response.output_item.added"]
    assert events[-1]["type"] == "response.function_call_arguments.delta"


def test_cut_by_max_output_tokens_marks_the_message_incomplete() -> None:
    events = build("Once upon a time", ["Once upon", " a time"], finish="length")
    response = check_events(events)
    assert events[-1]["type"] == "response.incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_a_call_cut_off_is_an_incomplete_item() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro'
    response = check_events(build(text, [text], finish="length"))
    assert response["output"][0]["status"] == "incomplete"
    assert response["output"][0]["arguments"] == '{"city": "Ro'


def test_xml_calls_are_announced_early_and_typed_at_the_end() -> None:
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "</function>\n</tool_call>")
    for chunks in chunkings(text, "xml"):
        response = check_events(build(text, chunks, layout=QWEN35))
        assert json.loads(response["output"][0]["arguments"]) == {"city": "Paris"}


def test_failed_response_closes_open_items() -> None:
    b = ResponseBuilder("resp_3", "m", {})
    events = b.start()
    parser = MessageStream(HERMES)
    events += b.add(parser.feed("partial"))
    events += b.fail("boom")
    response = check_events(events)
    assert events[-1]["type"] == "response.failed" and response["error"]["message"] == "boom"
    assert response["output"][0]["status"] == "incomplete"
