"""Anthropic Messages requests → chat messages and tools, with no model; any body shaped
like one is a request or a 400, never anything else."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.anthropic.request import parse_messages_request
from api.web.errors import APIError
from api.web.params import Body


def test_blocks_become_the_chat_conversation() -> None:
    req = parse_messages_request(Body({
        "max_tokens": 10, "system": [{"type": "text", "text": "Be brief.",
                                      "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image", "source": {"type": "url"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                 "content": [{"type": "text", "text": "boom"}]}]}]}))
    m = req.messages
    assert m[0] == {"role": "system", "content": "Be brief."}
    assert m[1]["content"] == "hi\n[image omitted: this model does not read it]"
    assert m[2]["reasoning_content"] == "hmm" and m[2]["content"] == "calling"
    assert m[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert m[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: boom"}
    assert [t["function"]["name"] for t in req.chat_body["tools"]] == ["f"]
    assert req.chat_body["tool_choice"] == "required"
    assert req.chat_body["parallel_tool_calls"] is False


VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2, 5), st.text(max_size=4),
              st.sampled_from(["user", "assistant", "text", "tool_use", "tool_result",
                               "thinking", "image", "auto", "any", "tool", "none"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["type", "role", "content", "text", "name", "input", "id", "tool_use_id",
         "thinking", "input_schema", "is_error"]), inner, max_size=4)),
    max_leaves=20)


@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["messages", "system", "tools", "tool_choice",
                                        "max_tokens", "stop_sequences", "thinking",
                                        "output_config"]), VALUES, max_size=6))
def test_any_shape_is_a_request_or_a_400(body: dict[str, Any]) -> None:
    try:
        parse_messages_request(Body(body))
    except APIError as exc:
        assert exc.status == 400
