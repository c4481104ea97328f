"""pydantic-ai against a real llamaserve on Qwen2.5-Coder-0.5B, over chat completions
(`OpenAIChatModel`) and over the Responses API (`OpenAIResponsesModel`).

Settings a user needs: `OpenAIChatModel(<alias>, provider=OpenAIProvider(base_url=…/v1,
api_key=<any>))` (or `OpenAIResponsesModel`). pydantic-ai-slim 2.31 is the newest release that
works with `openai<3`, which openai-agents and llama-index-llms-openai still require.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compat_models import ORDER_PROMPT, Order, check_order
from conftest import COMPAT_MODEL, ServerProcess, require_library

require_library("pydantic_ai")

from pydantic_ai import Agent, NativeOutput, ToolOutput  # noqa: E402
from pydantic_ai.messages import ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

KINDS = ["chat", "responses"]
SETTINGS: Any = {"temperature": 0, "max_tokens": 120}
WEATHER_QUESTION = "What is the weather in Paris? Use the get_weather tool."


def model(server: ServerProcess, kind: str) -> Any:
    provider = OpenAIProvider(base_url=server.base_url, api_key="unused")
    cls = OpenAIChatModel if kind == "chat" else OpenAIResponsesModel
    return cls(COMPAT_MODEL, provider=provider)


def weather_agent(server: ServerProcess, kind: str, calls: list[str]) -> Agent[None, str]:
    # no `instructions`: with a system prompt such as "Answer weather questions with the
    # get_weather tool." the 0.5B model writes bare {"name": …} objects in a loop instead of a
    # <tool_call> block (the model's failure, not the protocol's)
    agent = Agent(model(server, kind), model_settings=SETTINGS, retries=0)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"It is 18 degrees Celsius and sunny in {city}."

    return agent


def tool_parts(messages: list[Any]) -> tuple[list[ToolCallPart], list[ToolReturnPart]]:
    parts = [p for m in messages for p in m.parts]
    return ([p for p in parts if isinstance(p, ToolCallPart)],
            [p for p in parts if isinstance(p, ToolReturnPart)])


@pytest.mark.parametrize("kind", KINDS)
def test_agent_calls_its_tool(compat_qwen: ServerProcess, kind: str) -> None:
    calls: list[str] = []
    result = weather_agent(compat_qwen, kind, calls).run_sync(WEATHER_QUESTION)
    assert calls and all(isinstance(c, str) and c for c in calls)
    called, returned = tool_parts(result.all_messages())
    assert [c.tool_name for c in called] == ["get_weather"] * len(calls)
    assert len(returned) == len(called)
    assert isinstance(result.output, str) and result.output.strip()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("output", ["tool", "native"])
def test_nested_output_type(compat_qwen: ServerProcess, kind: str, output: str) -> None:
    # tool output (the default) offers a `final_result` tool whose parameters are Order's
    # schema with `$defs` (bug 1); native output sends it as response_format / text.format
    spec: Any = ToolOutput(Order) if output == "tool" else NativeOutput(Order)
    agent = Agent(model(compat_qwen, kind), output_type=spec,
                  model_settings={"temperature": 0, "max_tokens": 200}, retries=0)
    result = agent.run_sync(ORDER_PROMPT)
    check_order(result.output)


@pytest.mark.parametrize("kind", KINDS)
def test_run_stream_with_a_tool(compat_qwen: ServerProcess, kind: str) -> None:
    calls: list[str] = []
    agent = weather_agent(compat_qwen, kind, calls)

    async def run() -> tuple[str, list[str], Any]:
        async with agent.run_stream(WEATHER_QUESTION) as result:
            deltas = [d async for d in result.stream_text(delta=True)]
            return await result.get_output(), deltas, result.all_messages()

    output, deltas, messages = asyncio.run(run())
    assert calls, "the streamed tool call never ran"
    called, returned = tool_parts(messages)
    assert called and len(returned) == len(called)
    assert output.strip() and "".join(deltas) == output
