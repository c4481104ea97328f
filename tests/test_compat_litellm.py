"""litellm against a real llamaserve on Qwen2.5-Coder-0.5B and MiniLM.

Settings a user needs: model `openai/<alias>` (the `openai/` prefix selects the
OpenAI-compatible provider), `api_base=…/v1`, any `api_key`; `LITELLM_LOCAL_MODEL_COST_MAP=True`
offline (otherwise it fetches its price map at import).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from conftest import COMPAT_MODEL, ROOT, ServerProcess, require_library

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = require_library("litellm")

REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "minilm_reference.json").read_text())
MODEL = f"openai/{COMPAT_MODEL}"
WEATHER: list[Any] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]


def kw(server: ServerProcess) -> dict[str, Any]:
    return {"api_base": server.base_url, "api_key": "unused", "timeout": 180, "num_retries": 0}


def test_completion(compat_qwen: ServerProcess) -> None:
    r = litellm.completion(model=MODEL, messages=COUNT, temperature=0, max_tokens=40,
                           **kw(compat_qwen))
    text = r.choices[0].message.content
    assert text and text.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


def test_stream_joins_to_the_completion(compat_qwen: ServerProcess) -> None:
    whole = litellm.completion(model=MODEL, messages=COUNT, temperature=0, max_tokens=40,
                               **kw(compat_qwen)).choices[0].message.content
    chunks = list(litellm.completion(model=MODEL, messages=COUNT, temperature=0, max_tokens=40,
                                     stream=True, **kw(compat_qwen)))
    assert len(chunks) > 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_tool_call(compat_qwen: ServerProcess) -> None:
    r = litellm.completion(model=MODEL, temperature=0, max_tokens=64, tools=WEATHER,
                           messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                           **kw(compat_qwen))
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.id
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_embedding_matches_sentence_transformers(minilm_server: ServerProcess) -> None:
    r = litellm.embedding(model="openai/all-minilm-l6-v2", input=REFERENCE["sentences"][:4],
                          **kw(minilm_server))
    assert len(r.data) == 4
    for d, ref in zip(r.data, REFERENCE["vectors"][:4], strict=True):
        assert float(np.array(d["embedding"]) @ np.array(ref)) >= 0.99
    assert r.usage.prompt_tokens > 0


def test_responses(compat_qwen: ServerProcess) -> None:
    r = litellm.responses(model=MODEL, input="Count from 1 to 10, separated by commas.",
                          temperature=0, max_output_tokens=40, **kw(compat_qwen))
    assert r.status == "completed"
    (msg,) = [o for o in r.output if o.type == "message"]
    assert msg.content[0].text.strip()
    assert r.usage.output_tokens > 0


def test_responses_stream(compat_qwen: ServerProcess) -> None:
    events = list(litellm.responses(model=MODEL, input="Count from 1 to 10, separated by commas.",
                                    temperature=0, max_output_tokens=40, stream=True,
                                    **kw(compat_qwen)))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert deltas and deltas == done.text
