"""Schemas with large bounds, as real clients send them, through the clients themselves.

Before the grammar bounds (engine/constraints/json_schema.py and grammar.py), each of these
requests killed the server with a segmentation fault: the tool parameter with
``"maxLength": 524288`` that Claude Code sends, the same bound in a 200-byte chat
request, and a ``pattern`` of ``^a{1,300000}$``. Now each gets its answer and the
server goes on serving other clients.

tests/fixtures/claude_code_tools.json holds 24 tools shaped like Claude Code's first
request (our own text; the shapes are what matters: draft-07 ``$schema``,
``additionalProperties: false``, enums, arrays of objects with ``minItems`` /
``maxItems``, ``exclusiveMinimum``, and the ``Workflow`` tool's ``maxLength: 524288``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from openai import OpenAI

from conftest import ServerProcess, start_server, tiny_qwen_config

CLAUDE_CODE_TOOLS: list[Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "claude_code_tools.json").read_text())
BIG_TOOL: list[Any] = [{"type": "function", "function": {
    "name": "save", "parameters": {"type": "object", "properties": {
        "text": {"type": "string", "maxLength": 524288}}, "required": ["text"]}}}]


@pytest.fixture(scope="module")
def openai_client(qwen_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=qwen_server.base_url, api_key="unused", max_retries=0, timeout=120)


def still_serving(server: ServerProcess, client: OpenAI) -> None:
    """The process is alive, healthy, and answers a plain request of another client."""
    assert server.proc.poll() is None
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    r = client.completions.create(model="x", prompt="1, 2, 3,", max_tokens=3, temperature=0)
    assert r.choices[0].text


def test_tool_with_max_length_524288_is_called(qwen_server: ServerProcess,
                                               openai_client: OpenAI) -> None:
    """A 200-byte request: one tool, one string parameter bounded at 524288. The call is
    forced, so the grammar constrains every token; the bound is relaxed, not refused."""
    r = openai_client.chat.completions.create(
        model="x", temperature=0, max_tokens=40, tools=BIG_TOOL, tool_choice="required",
        messages=[{"role": "user", "content": "Save the text 'hello world'."}])
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "save"
    assert isinstance(json.loads(call.function.arguments)["text"], str)
    still_serving(qwen_server, openai_client)


def test_pattern_with_a_300000_repetition_is_followed(qwen_server: ServerProcess,
                                                      openai_client: OpenAI) -> None:
    schema = {"type": "object", "properties": {"word": {"type": "string",
                                                        "pattern": "^a{1,300000}$"}},
              "required": ["word"], "additionalProperties": False}
    r = openai_client.chat.completions.create(
        model="x", temperature=0, max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
        messages=[{"role": "user", "content": "Write a word made only of the letter a."}])
    text = r.choices[0].message.content or ""
    # cut by max_tokens or not, what was written follows the (relaxed) pattern: a+ only
    assert re.fullmatch(r'\{\s*"word"\s*:\s*"a*("\s*\})?', text), text
    still_serving(qwen_server, openai_client)


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The tiny Qwen-tokenizer model (Qwen2.5-Coder's real tokenizer, template and response
    schema: the same grammar for the same tools) with room for 24 tools' prompt: the 0.5B
    model took ~40 s of CI to prefill it twice."""
    server = start_server(tiny_qwen_config(n_ctx=8192, n_seq_max=2),
                          tmp_path_factory.mktemp("claude-tools"))
    yield server
    server.stop()


def test_claude_codes_24_tools_through_the_anthropic_sdk(tools_server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=tools_server.url, api_key="unused", max_retries=0,
                                 timeout=120)
    checks = tools_server.metrics()
    for choice in ({"type": "auto"}, {"type": "any"}):
        r = client.messages.create(
            model="x", max_tokens=24, tools=CLAUDE_CODE_TOOLS, tool_choice=choice,  # type: ignore[arg-type]
            system="You are an interactive CLI tool that helps users with software "
                   "engineering tasks.",
            messages=[{"role": "user", "content": "List the files in this directory."}],
            extra_body={"temperature": 0})
        assert r.stop_reason in ("end_turn", "max_tokens", "tool_use"), r
        if choice["type"] == "any":  # forced: a call, or a call cut by max_tokens
            assert r.stop_reason in ("tool_use", "max_tokens")
            names = {b.name for b in r.content if b.type == "tool_use"}
            assert names <= {t["name"] for t in CLAUDE_CODE_TOOLS}
    after = tools_server.metrics()
    # each grammar was parsed once by the checker process before the engine used it
    parsed = "llamaserve_grammar_checks_total{outcome=parsed}"
    assert after[parsed] >= checks.get(parsed, 0) + 1, after
    assert after["llamaserve_grammar_checks_total{outcome=crashed}"] == 0
    still_serving(tools_server, OpenAI(base_url=tools_server.base_url, api_key="unused",
                                       max_retries=0, timeout=120))


def test_over_budget_schema_is_a_400_naming_the_field(qwen_server: ServerProcess,
                                                      openai_client: OpenAI) -> None:
    """A schema whose grammar would pass the size budget gets a clear 400 in each API's
    shape, and the server goes on. (A tool's parameters over the budget fall back to any
    object instead, unless the tool is strict: tests/test_grammar.py.)"""
    huge = {"type": "object", "properties": {
        f"p{i}_" + "n" * 400: {"type": "string"} for i in range(3000)}}
    r = httpx.post(f"{qwen_server.base_url}/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                   "schema": huge}}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format" and "limit" in error["message"], error
    r = httpx.post(f"{qwen_server.url}/v1/messages", timeout=120, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        "output_config": {"format": {"type": "json_schema", "schema": huge}}})
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and "limit" in r.json()["error"]["message"], r.text
    still_serving(qwen_server, openai_client)
