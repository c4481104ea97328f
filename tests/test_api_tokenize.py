"""llama-server's /apply-template on a real model: the prompt it returns is the one the chat
route feeds the model (same tokens, same greedy continuation), tools included; bad bodies,
and template variables the server sets itself, are 400s in OpenAI's shape (every
template, and template arguments: tests/test_families_server.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import BadRequestError, OpenAI

from conftest import ServerProcess

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
HELLO = [{"role": "system", "content": "You answer in one short sentence."},
         {"role": "user", "content": "Say hello to Ada."}]
BODIES: dict[str, dict[str, Any]] = {
    "plain": {"messages": HELLO},
    "tools listed": {"messages": HELLO, "tools": [TOOL], "tool_choice": "auto"},
    "tools not offered": {"messages": HELLO, "tools": [TOOL], "tool_choice": "none"},
    "earlier call": {"messages": [
        *HELLO, {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "And now say goodbye."}], "tools": [TOOL]},
}


@pytest.fixture(scope="module")
def client(qwen_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=qwen_server.base_url, api_key="unused", max_retries=0)


def apply_template(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/apply-template", json=body, timeout=60)


@pytest.mark.parametrize("case", list(BODIES))
def test_the_prompt_is_the_one_the_chat_route_continues(qwen_server: ServerProcess,
                                                        client: OpenAI, case: str) -> None:
    body = BODIES[case]
    r = apply_template(qwen_server, body)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert isinstance(prompt, str) and prompt.endswith("<|im_start|>assistant\n")
    assert ("get_weather" in prompt) == (body.get("tool_choice") != "none"
                                         and "tools" in body)
    tokens = httpx.post(f"{qwen_server.base_url}/tokenize", json={
        "prompt": prompt, "add_special": False}, timeout=30).json()["tokens"]
    chat = client.chat.completions.create(model="x", max_tokens=12, temperature=0,
                                          **body)
    assert chat.usage is not None and chat.usage.prompt_tokens == len(tokens)
    raw = client.completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0)
    message = chat.choices[0].message
    if not message.tool_calls:  # a text answer: the same greedy text from the same prompt
        assert raw.choices[0].text.strip() == (message.content or "").strip()


@pytest.mark.parametrize("body, param", [
    ({}, "messages"),
    ({"messages": "Hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "Hi"}], "tools": "get_weather"}, "tools"),
    ({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": [1]},
     "chat_template_kwargs"),
    *[({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {name: v}},
       "chat_template_kwargs")
      for name, v in (("add_generation_prompt", False), ("tools", []), ("messages", []))],
])
def test_bad_bodies_are_400s_naming_the_field(qwen_server: ServerProcess,
                                               body: dict[str, Any], param: str) -> None:
    r = apply_template(qwen_server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]


@pytest.mark.parametrize("name", ["add_generation_prompt", "tools", "messages"])
def test_the_chat_route_refuses_template_variables_the_server_sets(client: OpenAI,
                                                                   name: str) -> None:
    """(they clashed with the server's own arguments to the template: a 500 before)"""
    with pytest.raises(BadRequestError) as err:
        client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
            extra_body={"chat_template_kwargs": {name: []}})
    assert err.value.status_code == 400 and err.value.param == "chat_template_kwargs"
    assert name in err.value.message
