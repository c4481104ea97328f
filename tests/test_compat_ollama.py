"""langchain-ollama (ChatOllama, OllamaEmbeddings), a tool built for Ollama's API, against a
real llamaserve on Qwen2.5-Coder-0.5B and MiniLM, unmodified.

Settings a user needs: `base_url=<the server's URL>` (no /v1: the library adds /api/...)
and `model=<the alias>` (with or without `:latest`); nothing else.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from compat_models import ORDER_PROMPT, Order, check_order
from conftest import COMPAT_MODEL, ROOT, ServerProcess, require_library

require_library("langchain_ollama")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_ollama import ChatOllama, OllamaEmbeddings  # noqa: E402

REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "minilm_reference.json").read_text())


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 18 degrees Celsius and sunny in {city}."


def chat(server: ServerProcess, **kw: Any) -> ChatOllama:
    # validate_model_on_init: the model is looked up in /api/tags first, as a user may ask
    return ChatOllama(base_url=server.url, model=COMPAT_MODEL, temperature=0,
                      validate_model_on_init=True, **kw)


def test_invoke_and_stream(compat_qwen: ServerProcess) -> None:
    llm = chat(compat_qwen, num_predict=12)
    prompt = "Count from 1 to 10, separated by commas."
    msg = llm.invoke(prompt)
    assert isinstance(msg, AIMessage) and isinstance(msg.content, str)
    assert msg.content.startswith("1, 2")
    assert msg.response_metadata["model"] == COMPAT_MODEL
    assert msg.response_metadata["done_reason"] == "length"
    assert msg.usage_metadata and msg.usage_metadata["input_tokens"] > 0
    assert msg.usage_metadata["output_tokens"] == 12
    chunks = list(llm.stream(prompt))
    assert len(chunks) > 3  # really streamed
    assert "".join(str(c.content) for c in chunks) == msg.content  # greedy: same text


def test_bind_tools_round_trip(compat_qwen: ServerProcess) -> None:
    llm = chat(compat_qwen, num_predict=64).bind_tools([get_weather])
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    first = llm.invoke(messages)
    assert isinstance(first, AIMessage)
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"]
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = llm.invoke(messages)
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert isinstance(final.content, str) and final.content.strip()


def test_with_structured_output_nested_model(compat_qwen: ServerProcess) -> None:
    # Order has $defs / $ref and an enum: sent as Ollama's `format` schema
    llm = chat(compat_qwen, num_predict=200).with_structured_output(Order, method="json_schema")
    check_order(llm.invoke(ORDER_PROMPT))  # type: ignore[arg-type]


def test_embeddings_match_sentence_transformers(minilm_server: ServerProcess) -> None:
    emb = OllamaEmbeddings(base_url=minilm_server.url, model="all-minilm-l6-v2:latest")
    docs = emb.embed_documents(REFERENCE["sentences"])
    assert len(docs) == len(REFERENCE["sentences"])
    for v, ref in zip(docs, REFERENCE["vectors"], strict=True):
        assert len(v) == 384 and float(np.array(v) @ np.array(ref)) >= 0.99
    q = emb.embed_query(REFERENCE["sentences"][0])
    assert float(np.array(q) @ np.array(REFERENCE["vectors"][0])) >= 0.99
