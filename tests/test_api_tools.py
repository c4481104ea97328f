"""Tool calls and structured output on the real Qwen2.5-Coder-0.5B-Instruct, via the OpenAI SDK."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from conftest import ServerProcess, load_config, qwen_config, start_server

WEATHER: list[Any] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(qwen_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=qwen_server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_weather_question_becomes_a_tool_call(client: OpenAI) -> None:
    r = client.chat.completions.create(model="x", messages=ASK, tools=WEATHER, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_streamed_tool_call_sends_the_name_once_then_arguments(client: OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="x", messages=ASK, tools=WEATHER,
                                                 temperature=0, stream=True))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    named = [tc for tc in calls if tc.function and tc.function.name]
    assert len(named) == 1 and named[0].id and named[0].type == "function"
    assert named[0].function is not None and named[0].function.name == "get_weather"
    assert all(tc.index == 0 for tc in calls)
    args = "".join(tc.function.arguments or "" for tc in calls if tc.function)
    assert json.loads(args) == {"city": "Paris"}
    assert not any(c.choices[0].delta.content for c in chunks)  # no markup or JSON as text
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_result_round_trips_into_the_answer(qwen_server: ServerProcess,
                                                 client: OpenAI) -> None:
    first = client.chat.completions.create(model="x", messages=ASK, tools=WEATHER, temperature=0)
    call = (first.choices[0].message.tool_calls or [])[0]
    messages: list[Any] = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id,
                            "content": "The weather in Paris is 18 degrees Celsius and sunny."}]
    rendered = httpx.post(f"{qwen_server.base_url}/tokenize", timeout=30, json={
        "messages": messages, "with_pieces": True}).json()
    prompt = "".join(rendered["pieces"])
    # arguments went to the template as an object, the result as a tool response
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nThe weather in Paris is 18 degrees" in prompt
    r = client.chat.completions.create(model="x", messages=messages, tools=WEATHER,
                                       tool_choice="none", temperature=0, max_tokens=60)
    assert "18" in (r.choices[0].message.content or "")


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_forced_tool_choice_on_an_unrelated_question(client: OpenAI, choice: Any) -> None:
    r = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Tell me a joke about cats."}],
        tools=WEATHER, tool_choice=choice, temperature=0)
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER[0]["function"]["parameters"])
    assert r.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_gives_one_call(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="x", temperature=0, tools=WEATHER, tool_choice="required",
        parallel_tool_calls=False,
        messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}])
    assert len(r.choices[0].message.tool_calls or []) == 1


def test_tool_choice_none_gives_plain_content(client: OpenAI) -> None:
    r = client.chat.completions.create(model="x", messages=ASK, tools=WEATHER,
                                       tool_choice="none", temperature=0, max_tokens=40)
    message = r.choices[0].message
    assert not message.tool_calls and message.content
    assert "<tool_call>" not in message.content
    assert r.choices[0].finish_reason in ("stop", "length")


PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["name", "age", "languages"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_validates(client: OpenAI, stream: bool) -> None:
    kwargs: dict[str, Any] = {
        "model": "x", "temperature": 0, "max_tokens": 120,
        "messages": [{"role": "user", "content": "Describe Ada Lovelace as a person."}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "person", "schema": PERSON, "strict": True}}}
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(stream=True, **kwargs))
    else:
        text = client.chat.completions.create(**kwargs).choices[0].message.content or ""
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_output_parses(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=80, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "List two colors."}])
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


@pytest.mark.parametrize("extra, param", [
    ({"tools": WEATHER, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": WEATHER, "tool_choice": {"type": "custom", "custom": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0]"),
    ({"tools": "get_weather"}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#/definitions/missing"}}}}, "response_format"),
])
def test_bad_tool_and_format_fields_are_400(client: OpenAI, extra: dict[str, Any],
                                            param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="x", messages=ASK, max_tokens=4,
                                       extra_body=extra)
    body = err.value.body
    assert isinstance(body, dict) and body.get("param") == param, body


def test_xml_call_format_is_enforced_and_parsed(tmp_path: Path) -> None:
    """The Qwen3.5 schema (XML-style calls) on a real model: the grammar makes the model
    write <function=...><parameter=...> blocks, and the parser types the values."""
    schema = load_config("qwen3.5-0.8b.json")["model"]["response_schema"]
    server = start_server(qwen_config(response_schema=schema), tmp_path)
    tools: list[Any] = [{"type": "function", "function": {
        "name": "get_forecast", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"]}}}]
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        for stream in (False, True):
            kwargs: dict[str, Any] = {
                "model": "x", "temperature": 0, "tools": tools, "tool_choice": "required",
                "messages": [{"role": "user", "content": "Forecast for Paris, 3 days?"}]}
            if stream:
                chunks = list(client.chat.completions.create(stream=True, **kwargs))
                deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
                name = next(tc.function.name for tc in deltas if tc.function and
                            tc.function.name)
                args = json.loads("".join(tc.function.arguments or "" for tc in deltas
                                          if tc.function))
            else:
                (call,) = client.chat.completions.create(**kwargs).choices[0].message \
                    .tool_calls or []
                name, args = call.function.name, json.loads(call.function.arguments)
            assert name == "get_forecast"
            jsonschema.validate(args, tools[0]["function"]["parameters"])
            assert isinstance(args["days"], int)
    finally:
        server.stop()


# -- custom (freeform) tools, as Chat Completions takes them ------------------------------
SUM_TOOL: list[Any] = [{"type": "custom", "custom": {
    "name": "calc", "description": "Evaluate a sum of whole numbers.",
    "format": {"type": "grammar", "grammar": {
        "syntax": "lark", "definition": 'start: INT (" + " INT)+\n%import common.INT'}}}}]
SUM_ASK: list[Any] = [{"role": "user", "content": "Use calc to add 12 and 30."}]


def test_a_custom_tool_call_comes_back_with_its_input(client: OpenAI) -> None:
    """A custom tool with a Lark grammar, forced: the SDK reads a ``custom`` call whose
    input follows the grammar; streamed, the same call arrives as its name, then its input
    whole (the chunk shape OpenAI's own custom calls use)."""
    choice = {"type": "custom", "custom": {"name": "calc"}}
    r = client.chat.completions.create(model="x", messages=SUM_ASK, tools=SUM_TOOL,
                                       tool_choice=choice, temperature=0, max_tokens=40)
    (call,) = r.choices[0].message.tool_calls or []
    assert call.type == "custom" and call.custom.name == "calc", call
    assert re.fullmatch(r"[0-9]+( \+ [0-9]+)+", call.custom.input), call.custom.input
    chunks = list(client.chat.completions.create(model="x", messages=SUM_ASK, tools=SUM_TOOL,
                                                 tool_choice=choice, temperature=0,
                                                 max_tokens=40, stream=True))
    parts = [tc.model_dump() for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert parts[0]["type"] == "custom" and parts[0]["custom"]["name"] == "calc", parts
    streamed = "".join(p.get("custom", {}).get("input", "") for p in parts)
    assert streamed == call.custom.input and chunks[-1].choices[0].finish_reason == "tool_calls"
    # the call and its output sent back: the template sees the input as its argument
    messages: list[Any] = [*SUM_ASK, r.choices[0].message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    again = client.chat.completions.create(model="x", messages=messages, tools=SUM_TOOL,
                                           tool_choice="none", temperature=0, max_tokens=20)
    assert again.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("tool, param", [
    ({"type": "custom"}, "tools[0]"),
    ({"type": "custom", "custom": {"name": "c", "format": {"type": "grammar", "grammar": {
        "syntax": "lark", "definition": "start: nothing"}}}}, "tools[0].custom.format"),
    ({"type": "custom", "custom": {"name": "c", "format": {"type": "grammar", "grammar": {
        "syntax": "regex", "definition": "(a"}}}}, "tools[0].custom.format"),
])
def test_a_custom_tool_it_cannot_enforce_is_a_400(client: OpenAI, tool: Any,
                                                   param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="x", messages=SUM_ASK, tools=[tool])
    assert err.value.param == param
