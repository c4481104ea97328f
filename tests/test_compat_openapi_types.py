"""A typed client generated from OpenAI's OpenAPI description, against a real llamaserve.

`datamodel-code-generator` turns the description kept in `tests/fixtures/` into pydantic
models at test time, as a team building a typed client in any language generates one (with
the allowances of `tests/openapi_check.py` for what the live API itself sends, such as a
stream chunk's null `finish_reason`, which a client of the real API must accept too). The
models are strict where the description is: a required field that is missing, an enum value
it does not list, a wrong type fails the parse (the Python SDK's own models are lenient and
let such gaps through). Each route the SDK calls is answered and parsed into its generated
type: models, chat completions (plain, tools, logprobs, n, streamed chunks), completions,
Responses (whole, background, input items, input tokens, cancel, streamed events),
conversations and their items, files and batches on a default start, and errors.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest

from conftest import COMPAT_MODEL, ServerProcess, require_library
from openapi_check import relaxed_spec

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def types(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    require_library("datamodel_code_generator")
    tmp = tmp_path_factory.mktemp("openapi-types")
    spec = tmp / "openapi.json"
    spec.write_text(json.dumps(relaxed_spec()))
    out = tmp / "openai_types.py"
    subprocess.run([sys.executable, "-m", "datamodel_code_generator", "--input", str(spec),
                    "--input-file-type", "openapi", "--output", str(out),
                    "--output-model-type", "pydantic_v2.BaseModel",
                    "--target-python-version", "3.11"],
                   check=True, capture_output=True, timeout=300)
    loaded = importlib.util.spec_from_file_location("openai_types", out)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules["openai_types"] = module
    loaded.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def http(compat_qwen: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=compat_qwen.base_url, timeout=180) as client:
        yield client


def generated(types: ModuleType, name: str) -> Any:
    """The generated type of the description's schema ``name`` (a name an enum took
    first gets a suffix: schema ``Model`` is class ``ModelModel``)."""
    for candidate in (name, f"{name}Model"):
        cls = getattr(types, candidate, None)
        if isinstance(cls, type) and hasattr(cls, "model_validate"):
            return cls
    raise LookupError(f"no generated type for {name}")


def parsed(types: ModuleType, name: str, reply: httpx.Response, status: int = 200) -> Any:
    assert reply.status_code == status, reply.text
    return generated(types, name).model_validate(reply.json())


def value(field: Any) -> Any:
    """A generated enum's value (or the plain value)."""
    return getattr(field, "value", field)


def events(reply: httpx.Response) -> list[Any]:
    assert reply.status_code == 200, reply.text
    return [json.loads(line[5:]) for line in reply.text.splitlines()
            if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def test_models(types: ModuleType, http: httpx.Client) -> None:
    listed = parsed(types, "ListModelsResponse", http.get("/models"))
    for entry in listed.data:
        one = parsed(types, "Model", http.get(f"/models/{entry.id}"))
        assert one.id == entry.id
    parsed(types, "ErrorResponse", http.get("/models/none-such"), 404)


def test_chat_completions(types: ModuleType, http: httpx.Client) -> None:
    base = {"model": COMPAT_MODEL, "max_tokens": 12, "temperature": 0}
    messages = [{"role": "user", "content": "Say hello."}]
    plain = parsed(types, "CreateChatCompletionResponse", http.post(
        "/chat/completions", json={**base, "messages": messages, "n": 2, "logprobs": True,
                                   "top_logprobs": 2}))
    assert len(plain.choices) == 2 and plain.choices[0].message.content
    called = parsed(types, "CreateChatCompletionResponse", http.post(
        "/chat/completions", json={**base, "max_tokens": 48, "tools": [WEATHER],
                                   "tool_choice": "required", "messages": [
                                       {"role": "user", "content": "Weather in Oslo?"}]}))
    assert called.choices[0].message.tool_calls
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    parsed(types, "CreateChatCompletionResponse", http.post("/chat/completions", json={
        **base, "messages": messages, "response_format": {
            "type": "json_schema", "json_schema": {"name": "n", "schema": schema,
                                                   "strict": True}}}))
    for body in ({"logprobs": True}, {"tools": [WEATHER], "max_tokens": 48,
                                      "tool_choice": "required"}):
        chunks = events(http.post("/chat/completions", json={
            **base, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, **body}))
        for chunk in chunks:
            generated(types, "CreateChatCompletionStreamResponse").model_validate(chunk)
        assert chunks[-1]["usage"]["completion_tokens"] > 0
    error = http.post("/chat/completions", json={**base, "messages": "not a list"})
    parsed(types, "ErrorResponse", error, 400)


def test_completions(types: ModuleType, http: httpx.Client) -> None:
    body = {"model": COMPAT_MODEL, "prompt": "def add(a, b):", "max_tokens": 8,
            "temperature": 0, "logprobs": 2}
    parsed(types, "CreateCompletionResponse", http.post("/completions", json=body))
    for chunk in events(http.post("/completions", json={**body, "stream": True})):
        generated(types, "CreateCompletionResponse").model_validate(chunk)


def test_responses(types: ModuleType, http: httpx.Client) -> None:
    base = {"model": COMPAT_MODEL, "max_output_tokens": 16, "temperature": 0}
    tools = [{"type": "function", **WEATHER["function"]}]
    whole = parsed(types, "Response", http.post("/responses", json={
        **base, "input": "Weather in Rome?", "tools": tools, "tool_choice": "required",
        "max_output_tokens": 48}))
    got = parsed(types, "Response", http.get(f"/responses/{whole.id}"))
    assert got.id == whole.id
    items = parsed(types, "ResponseItemList", http.get(f"/responses/{whole.id}/input_items"))
    assert len(items.data) == 1
    counted = parsed(types, "TokenCountsResource", http.post(
        "/responses/input_tokens", json={"model": COMPAT_MODEL, "input": "Weather in Rome?",
                                         "tools": tools}))
    assert counted.input_tokens > 0
    for event in events(http.post("/responses", json={**base, "input": "Hi", "stream": True})):
        generated(types, "ResponseStreamEvent").model_validate(event)
    queued = parsed(types, "Response", http.post("/responses", json={
        **base, "input": "Write a long poem.", "background": True,
        "max_output_tokens": 2000}))
    cancelled = parsed(types, "Response", http.post(f"/responses/{queued.id}/cancel"))
    assert value(cancelled.status) == "cancelled"
    parsed(types, "ErrorResponse", http.get("/responses/resp_none"), 404)


def test_conversations(types: ModuleType, http: httpx.Client) -> None:
    conv = parsed(types, "ConversationResource", http.post("/conversations", json={
        "items": [{"type": "message", "role": "user", "content": "I like tea."}],
        "metadata": {"k": "v"}}))
    parsed(types, "Response", http.post("/responses", json={
        "model": COMPAT_MODEL, "conversation": conv.id, "input": "What do I like?",
        "max_output_tokens": 12, "temperature": 0}))
    items = parsed(types, "ConversationItemList",
                   http.get(f"/conversations/{conv.id}/items", params={"order": "asc"}))
    assert len(items.data) == 3
    parsed(types, "ConversationResource", http.post(f"/conversations/{conv.id}",
                                                    json={"metadata": {"k": "w"}}))
    parsed(types, "DeletedConversationResource", http.delete(f"/conversations/{conv.id}"))


def test_files_and_batches_on_a_default_start(types: ModuleType, http: httpx.Client) -> None:
    line = {"custom_id": "1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": COMPAT_MODEL, "max_tokens": 4,
                     "messages": [{"role": "user", "content": "Hi"}]}}
    upload = parsed(types, "OpenAIFile", http.post(
        "/files", data={"purpose": "batch"},
        files={"file": ("in.jsonl", json.dumps(line).encode())}))
    parsed(types, "ListFilesResponse", http.get("/files"))
    batch = parsed(types, "Batch", http.post("/batches", json={
        "input_file_id": upload.id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"}))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        batch = parsed(types, "Batch", http.get(f"/batches/{batch.id}"))
        if value(batch.status) in ("completed", "failed"):
            break
        time.sleep(0.2)
    assert value(batch.status) == "completed"
    parsed(types, "ListBatchesResponse", http.get("/batches"))
