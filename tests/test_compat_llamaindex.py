"""LlamaIndex against a real llamaserve on Qwen2.5-Coder-0.5B and MiniLM.

Settings a user needs: `OpenAILike(model=<alias>, api_base=…/v1, api_key=<any>,
is_chat_model=True, is_function_calling_model=True, context_window=<n_ctx>)` (OpenAI() itself
rejects model names it does not know); `OpenAIEmbedding(model_name=<alias>, api_base=…,
api_key=<any>)` — `model_name`, since `model` is checked against OpenAI's own model list;
`JinaRerank(model=<alias>, base_url=…/v1, api_key=<any>, top_n=…)` (the
llama-index-postprocessor-jinaai-rerank package) for /v1/rerank.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from compat_models import ORDER_PROMPT, WEATHER_PROMPT, Order, Weather, check_order
from conftest import (
    COMPAT_MODEL,
    ROOT,
    ServerProcess,
    require_library,
    reranker_config,
    start_server,
)

require_library("llama_index.llms.openai_like")

from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.core.prompts import PromptTemplate  # noqa: E402
from llama_index.core.schema import NodeWithScore, TextNode  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402
from llama_index.embeddings.openai import OpenAIEmbedding  # noqa: E402
from llama_index.llms.openai_like import OpenAILike  # noqa: E402

REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "minilm_reference.json").read_text())


def llm(server: ServerProcess, **kw: Any) -> OpenAILike:
    return OpenAILike(model=COMPAT_MODEL, api_base=server.base_url, api_key="unused",
                      is_chat_model=True, is_function_calling_model=True, context_window=8192,
                      temperature=0, max_tokens=kw.pop("max_tokens", 64), max_retries=0,
                      timeout=180, **kw)


def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 18 degrees Celsius and sunny in {city}."


def test_chat_and_stream_chat(compat_qwen: ServerProcess) -> None:
    model = llm(compat_qwen, max_tokens=40)
    messages = [ChatMessage(role="user", content="Count from 1 to 10, separated by commas.")]
    r = model.chat(messages)
    assert r.message.role == "assistant" and r.message.content and r.message.content.strip()
    chunks = list(model.stream_chat(messages))
    assert len(chunks) > 2
    assert "".join(c.delta or "" for c in chunks) == r.message.content
    assert chunks[-1].message.content == r.message.content


def test_complete(compat_qwen: ServerProcess) -> None:
    r = llm(compat_qwen, max_tokens=16).complete("Say hello.")
    assert r.text.strip()


def test_tool_call(compat_qwen: ServerProcess) -> None:
    model = llm(compat_qwen)
    tool = FunctionTool.from_defaults(fn=get_weather)
    response = model.chat_with_tools([tool], user_msg="What is the weather in Paris?")
    (call,) = model.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    assert call.tool_name == "get_weather" and call.tool_id
    assert isinstance(call.tool_kwargs["city"], str)
    assert "18 degrees" in str(tool(**call.tool_kwargs))


def test_predict_and_call(compat_qwen: ServerProcess) -> None:
    tool = FunctionTool.from_defaults(fn=get_weather)
    out = llm(compat_qwen).predict_and_call([tool], user_msg="What is the weather in Paris?")
    assert out.sources and out.sources[0].tool_name == "get_weather"
    assert "18 degrees" in str(out)


def test_structured_predict(compat_qwen: ServerProcess) -> None:
    out = llm(compat_qwen, max_tokens=100).structured_predict(
        Weather, PromptTemplate("{text}"), text=WEATHER_PROMPT)
    assert isinstance(out, Weather) and out.city and isinstance(out.temperature_c, int)


def test_structured_predict_nested_model(compat_qwen: ServerProcess) -> None:
    # a function-calling LLM predicts through a forced tool call whose parameters are
    # Order's schema with "$defs" (bug 1)
    out = llm(compat_qwen, max_tokens=200).structured_predict(
        Order, PromptTemplate("{text}"), text=ORDER_PROMPT)
    check_order(out)


def test_embedding_matches_sentence_transformers(minilm_server: ServerProcess) -> None:
    emb = OpenAIEmbedding(model_name="all-minilm-l6-v2", api_base=minilm_server.base_url,
                          api_key="unused", max_retries=0)
    vectors = emb.get_text_embedding_batch(REFERENCE["sentences"][:4])
    for v, ref in zip(vectors, REFERENCE["vectors"][:4], strict=True):
        assert float(np.array(v) @ np.array(ref)) >= 0.99
    q = asyncio.run(emb.aget_query_embedding(REFERENCE["sentences"][0]))
    assert float(np.array(q) @ np.array(REFERENCE["vectors"][0])) >= 0.99


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The generated Qwen3-style reranker (random weights: the order is noise)."""
    server = start_server(reranker_config("qwen3"), tmp_path_factory.mktemp("rerank"))
    yield server
    server.stop()


def test_jina_rerank_postprocessor(reranker: ServerProcess) -> None:
    jina = require_library("llama_index.postprocessor.jinaai_rerank")
    texts = ["Paris is the capital of France.", "Bananas are yellow.",
             "The Seine flows through Paris.", "Mount Everest is in Nepal."]
    query = "Which river runs through Paris?"
    rerank = jina.JinaRerank(model="reranker-qwen3", base_url=reranker.base_url,
                             api_key="unused", top_n=2)
    nodes = [NodeWithScore(node=TextNode(text=t), score=0.0) for t in texts]
    out = rerank.postprocess_nodes(nodes, query_str=query)
    expected = httpx.post(f"{reranker.base_url}/rerank", timeout=60, json={
        "model": "reranker-qwen3", "query": query, "documents": texts}).json()["results"]
    assert [n.node.get_content() for n in out] == [texts[r["index"]] for r in expected[:2]]
    assert [n.score for n in out] == [r["relevance_score"] for r in expected[:2]]
