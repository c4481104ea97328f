"""OpenAI Agents SDK against a real llamaserve on Qwen2.5-Coder-0.5B: an agent with a function
tool, over the Responses API (the SDK's default) and over chat completions, plain and streamed.

Settings a user needs: `OpenAIResponsesModel(model=<alias>, openai_client=AsyncOpenAI(
base_url=…/v1, api_key=<any>))` (or `OpenAIChatCompletionsModel`), and
`set_tracing_disabled(True)` (tracing uploads to OpenAI otherwise).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai import AsyncOpenAI

from conftest import COMPAT_MODEL, ServerProcess, require_library

require_library("agents")

from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem  # noqa: E402

set_tracing_disabled(True)
KINDS = ["responses", "chat"]


def weather_agent(server: ServerProcess, kind: str, calls: list[str]) -> Agent[Any]:
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=180)
    model: Any = (OpenAIResponsesModel(model=COMPAT_MODEL, openai_client=client)
                  if kind == "responses" else
                  OpenAIChatCompletionsModel(model=COMPAT_MODEL, openai_client=client))

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"It is 18 degrees Celsius and sunny in {city}."

    # tool_choice "required" makes the call certain; the SDK resets it after the tool ran
    # (reset_tool_choice), so the second turn answers in text
    return Agent(name="weather", model=model, tools=[get_weather],
                 model_settings=ModelSettings(temperature=0, max_tokens=80,
                                              tool_choice="required"))


def check_run(result: Any, calls: list[str]) -> None:
    assert calls and all(isinstance(c, str) and c for c in calls)
    assert any(isinstance(i, ToolCallItem) for i in result.new_items)
    assert any(isinstance(i, ToolCallOutputItem) and "18 degrees" in str(i.output)
               for i in result.new_items)
    assert isinstance(result.final_output, str) and result.final_output.strip()


@pytest.mark.parametrize("kind", KINDS)
def test_agent_with_a_function_tool(compat_qwen: ServerProcess, kind: str) -> None:
    calls: list[str] = []
    result = Runner.run_sync(weather_agent(compat_qwen, kind, calls),
                             "What is the weather in Paris?", max_turns=4)
    check_run(result, calls)


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_agent_with_a_function_tool(compat_qwen: ServerProcess, kind: str) -> None:
    calls: list[str] = []

    async def run() -> tuple[Any, str]:
        result = Runner.run_streamed(weather_agent(compat_qwen, kind, calls),
                                     "What is the weather in Paris?", max_turns=4)
        text = []
        async for event in result.stream_events():
            if event.type == "raw_response_event" and \
                    event.data.type == "response.output_text.delta":
                text.append(event.data.delta)
        return result, "".join(text)

    result, streamed = asyncio.run(run())
    check_run(result, calls)
    assert streamed.endswith(result.final_output)
