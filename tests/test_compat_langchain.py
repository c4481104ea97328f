"""LangChain (langchain-openai) against a real llamaserve on Qwen2.5-Coder-0.5B and MiniLM.

Settings a user needs: `ChatOpenAI(base_url=…/v1, api_key=<any>, model=<alias>)`;
`OpenAIEmbeddings(…, check_embedding_ctx_length=False)` (the default sends tiktoken token ids,
which the server would embed as its own vocabulary's ids).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

from compat_models import (
    ORDER_PROMPT,
    GetWeather,
    Location,
    Order,
    check_order,
)
from conftest import COMPAT_MODEL, ROOT, ServerProcess, require_library

require_library("langchain_openai")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI, OpenAIEmbeddings  # noqa: E402

REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "minilm_reference.json").read_text())


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 18 degrees Celsius and sunny in {city}."


def chat(server: ServerProcess, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=server.base_url, api_key="unused", model=COMPAT_MODEL,  # type: ignore[arg-type]
                      temperature=0, max_retries=0, timeout=180, **kw)


def test_invoke(compat_qwen: ServerProcess) -> None:
    msg = chat(compat_qwen, max_tokens=32).invoke("Say hello in one short sentence.")
    assert isinstance(msg, AIMessage) and isinstance(msg.content, str) and msg.content.strip()
    assert msg.response_metadata["finish_reason"] in ("stop", "length")
    assert msg.response_metadata["model_name"] == COMPAT_MODEL
    assert msg.usage_metadata and msg.usage_metadata["input_tokens"] > 0
    assert msg.usage_metadata["output_tokens"] > 0


def test_stream_joins_to_the_invoked_text(compat_qwen: ServerProcess) -> None:
    llm = chat(compat_qwen, max_tokens=40)
    prompt = "Count from 1 to 10, separated by commas."
    chunks = list(llm.stream(prompt))
    assert len(chunks) > 2  # really streamed
    joined = "".join(str(c.content) for c in chunks)
    assert joined.strip() and joined == llm.invoke(prompt).content  # greedy: same text


def test_batch_keeps_the_order(compat_qwen: ServerProcess) -> None:
    words = ["apple", "river", "guitar"]
    out = chat(compat_qwen, max_tokens=16).batch(
        [f"Repeat exactly this one word and nothing else: {w}" for w in words])
    assert len(out) == 3
    for w, msg in zip(words, out, strict=True):
        assert w in str(msg.content).lower()


def test_bind_tools_flat_tool_call(compat_qwen: ServerProcess) -> None:
    msg = chat(compat_qwen, max_tokens=64).bind_tools([get_weather]).invoke(
        "What is the weather in Paris?")
    assert isinstance(msg, AIMessage)
    (call,) = msg.tool_calls
    assert call["name"] == "get_weather" and call["id"]
    assert isinstance(call["args"]["city"], str) and call["args"]["city"]
    assert msg.response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("tool_choice", [None, "GetWeather"])
def test_bind_tools_nested_pydantic_tool(compat_qwen: ServerProcess,
                                         tool_choice: str | None) -> None:
    # GetWeather.location is a nested model: its parameters carry "$defs" / "$ref" (bug 1)
    llm = chat(compat_qwen, max_tokens=64).bind_tools([GetWeather], tool_choice=tool_choice)
    msg = llm.invoke("What is the weather in Paris, France?")
    (call,) = msg.tool_calls
    assert call["name"] == "GetWeather"
    GetWeather.model_validate(call["args"])
    assert isinstance(GetWeather.model_validate(call["args"]).location, Location)


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_with_structured_output_nested_model(compat_qwen: ServerProcess, method: str) -> None:
    prompt = ORDER_PROMPT
    if method == "json_mode":  # no schema reaches the server: the prompt has to describe it
        prompt += (' Answer with a JSON object {"customer": string, "items": [{"name": string,'
                   ' "color": "red" | "green" | "blue"}]}.')
    llm = chat(compat_qwen, max_tokens=200).with_structured_output(
        Order, method=method, include_raw=True)  # type: ignore[arg-type]
    out: dict[str, Any] = llm.invoke(prompt)  # type: ignore[assignment]
    assert out["parsing_error"] is None, out["raw"]
    check_order(out["parsed"])


def test_with_structured_output_dict_schema(compat_qwen: ServerProcess) -> None:
    class Person(BaseModel):
        name: str
        age: int

    llm = chat(compat_qwen, max_tokens=60).with_structured_output(Person.model_json_schema())
    out = llm.invoke("Bob is 42 years old.")
    assert isinstance(out, dict)
    Person.model_validate(out)


def test_embeddings_match_sentence_transformers(minilm_server: ServerProcess) -> None:
    emb = OpenAIEmbeddings(base_url=minilm_server.base_url, api_key="unused",  # type: ignore[arg-type]
                           model="all-minilm-l6-v2", check_embedding_ctx_length=False,
                           max_retries=0)
    docs = emb.embed_documents(REFERENCE["sentences"])
    assert len(docs) == len(REFERENCE["sentences"])
    for v, ref in zip(docs, REFERENCE["vectors"], strict=True):
        assert len(v) == 384 and float(np.array(v) @ np.array(ref)) >= 0.99
    q = emb.embed_query(REFERENCE["sentences"][0])
    assert float(np.array(q) @ np.array(REFERENCE["vectors"][0])) >= 0.99


def test_embeddings_from_the_generation_model(compat_qwen: ServerProcess) -> None:
    emb = OpenAIEmbeddings(base_url=compat_qwen.base_url, api_key="unused",  # type: ignore[arg-type]
                           model=COMPAT_MODEL, check_embedding_ctx_length=False, max_retries=0)
    a, b = emb.embed_documents(["The cat sits on the mat.", "The cat sits on the mat."])
    assert len(a) > 100 and abs(float(np.linalg.norm(a)) - 1) < 1e-3
    assert float(np.array(a) @ np.array(b)) > 0.999


def test_responses_api_invoke_and_stream(compat_qwen: ServerProcess) -> None:
    llm = chat(compat_qwen, max_tokens=40, use_responses_api=True)
    prompt = "Count from 1 to 10, separated by commas."
    msg = llm.invoke(prompt)
    assert isinstance(msg, AIMessage) and msg.text.strip()
    assert msg.response_metadata.get("status") == "completed"
    assert msg.usage_metadata and msg.usage_metadata["output_tokens"] > 0
    chunks = list(llm.stream(prompt))
    joined = "".join(c.text for c in chunks)
    assert joined == msg.text


def test_responses_api_tool_round_trip(compat_qwen: ServerProcess) -> None:
    llm = chat(compat_qwen, max_tokens=80, use_responses_api=True).bind_tools([get_weather])
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    first = llm.invoke(messages)
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and call["id"]
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = llm.invoke(messages)
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert final.text.strip()
    # the 0.5B model may go on past its answer (it echoes the call and a made-up result as
    # text); cut at max_tokens, the response is then "incomplete", as OpenAI reports it
    assert final.response_metadata.get("status") in ("completed", "incomplete")
