"""The OpenAI SDK's stream helpers against a real llamaserve on Qwen2.5-Coder-0.5B: what the
libraries built on it see. `client.responses.stream()` accumulates every event onto a snapshot
of the response, so an event that is not a snapshot of its moment (an `output_item.added`
already holding the arguments its deltas then repeat) shows up as doubled arguments.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from conftest import COMPAT_MODEL, ServerProcess

WEATHER: list[Any] = [{"type": "function", "name": "get_weather",
                       "description": "Get the current weather for a city",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                      "required": ["city"]}}]


@pytest.fixture(scope="module")
def client(compat_qwen: ServerProcess) -> Iterator[OpenAI]:
    c = OpenAI(base_url=compat_qwen.base_url, api_key="unused", max_retries=0, timeout=180)
    yield c
    c.close()


def test_responses_stream_snapshot_of_a_function_call(client: OpenAI) -> None:
    with client.responses.stream(model=COMPAT_MODEL, input="What is the weather in Paris?",
                                 tools=WEATHER, temperature=0, max_output_tokens=64) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added and added[0].item.type == "function_call"
    assert added[0].item.status == "in_progress" and added[0].item.arguments == ""
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert deltas and deltas[-1].snapshot == call.arguments
    assert "".join(d.delta for d in deltas) == call.arguments
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert final.status == "completed"


def test_responses_stream_snapshot_of_text(client: OpenAI) -> None:
    with client.responses.stream(model=COMPAT_MODEL, temperature=0, max_output_tokens=40,
                                 input="Count from 1 to 10, separated by commas.") as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and deltas[-1].snapshot == final.output_text
    assert "".join(d.delta for d in deltas) == final.output_text


def test_chat_stream_helper_accumulates_a_tool_call(client: OpenAI) -> None:
    tools: Any = [{"type": "function", "function": {k: v for k, v in WEATHER[0].items()
                                                    if k != "type"}}]
    with client.chat.completions.stream(
            model=COMPAT_MODEL, temperature=0, max_tokens=64, tools=tools,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments)["city"], str)  # type: ignore[union-attr]
