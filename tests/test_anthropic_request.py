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
              st.sampled_from(["user", "assistant", "system", "text", "tool_use",
                               "tool_result", "tool_reference", "thinking", "image",
                               "document", "search_result", "server_tool_use", "auto", "any",
                               "tool", "none", "all", "high", "clear_thinking_20251015"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["type", "role", "content", "text", "name", "input", "id", "tool_use_id",
         "thinking", "input_schema", "is_error", "tool_name", "defer_loading", "source",
         "data", "title", "edits", "keep", "value", "effort", "format"]), inner, max_size=4)),
    max_leaves=20)


@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["messages", "system", "tools", "tool_choice",
                                        "max_tokens", "stop_sequences", "thinking",
                                        "output_config", "context_management"]), VALUES,
                       max_size=6))
def test_any_shape_is_a_request_or_a_400(body: dict[str, Any]) -> None:
    try:
        parse_messages_request(Body(body))
    except APIError as exc:
        assert exc.status == 400


# --- the shape Claude Code sends -----------------------------------------------------------

def _tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": name, "input_schema": {"type": "object"}, **extra}


CLAUDE_CODE_SHAPE: dict[str, Any] = {
    "max_tokens": 32000, "metadata": {"user_id": "{\"session_id\": \"s\"}"},
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8;"},
               {"type": "text", "text": "You are an agent.", "cache_control": {
                   "type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>r"},
                                     {"type": "text", "text": "find cron tools"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "old thought", "signature": "s"},
            {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch",
             "input": {"query": "cron"}},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": {"query": "q"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "tool_reference",
                                                   "tool_name": "CronCreate"}]}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "new thought",
                                           "signature": "s"},
                                          {"type": "text", "text": "Found it."}]},
        {"role": "user", "content": "go on"},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /w",
                                        "cache_control": {"type": "ephemeral"}}]}],
    "tools": [_tool("Bash"), _tool("ToolSearch"), _tool("CronCreate", defer_loading=True),
              _tool("Monitor", defer_loading=True),
              {"type": "web_search_20250305", "name": "web_search"}],
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                      "keep": {"type": "thinking_turns", "value": 1}}]},
    "output_config": {"effort": "max"}, "stream": True,
}


def test_claude_codes_request_becomes_a_chat_request() -> None:
    req = parse_messages_request(Body(CLAUDE_CODE_SHAPE))
    roles = [m["role"] for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "system"]
    # the billing header (a per-conversation fingerprint) is not part of the prompt
    assert req.messages[0]["content"] == "You are an agent."
    assert req.messages[-1]["content"] == "# Environment\ncwd: /w"  # placed by the template
    # a deferred tool is in the prompt once a tool search loaded it, not before
    names = [t["function"]["name"] for t in req.chat_body["tools"]]
    assert names == ["Bash", "ToolSearch", "CronCreate"]
    assert req.messages[3]["content"] == "Tool loaded: CronCreate"
    # the server tool's call and result are not the client's: left out of the turn
    assert [c["function"]["name"] for c in req.messages[2]["tool_calls"]] == ["ToolSearch"]
    # clear_thinking keeps the last turn's thinking only
    assert "reasoning_content" not in req.messages[2]
    assert req.messages[4]["reasoning_content"] == "new thought"
    assert req.extra == {"enable_thinking": True, "reasoning_effort": "high"}
    assert req.chat_body["max_tokens"] == 32000 and req.stream


def test_keep_all_keeps_every_thinking_turn_and_bad_edits_are_400() -> None:
    body = {**CLAUDE_CODE_SHAPE, "context_management": {"edits": [
        {"type": "clear_thinking_20251015", "keep": "all"},
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens",
                                                        "value": 100}}]}}
    req = parse_messages_request(Body(body))
    assert [m.get("reasoning_content") for m in req.messages if m["role"] == "assistant"] \
        == ["old thought", "new thought"]
    for bad, field in [({"edits": "x"}, "context_management.edits"),
                       ({"edits": [{"type": "clear_thinking_20251015", "keep": {"value": -1}}]},
                        "context_management.edits[0].keep")]:
        try:
            parse_messages_request(Body({**CLAUDE_CODE_SHAPE, "context_management": bad}))
        except APIError as exc:
            assert exc.status == 400 and exc.param == field
        else:
            raise AssertionError(f"{bad} was accepted")
    try:
        parse_messages_request(Body({**CLAUDE_CODE_SHAPE, "output_config": {"effort": "huge"}}))
    except APIError as exc:
        assert exc.status == 400 and exc.param == "output_config.effort"
    else:
        raise AssertionError("effort 'huge' was accepted")


def test_plain_text_documents_and_search_results_are_read() -> None:
    req = parse_messages_request(Body({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "title": "Notes", "source": {"type": "text", "data": "alpha"}},
        {"type": "search_result", "title": "Hit", "source": "u", "content": [
            {"type": "text", "text": "beta"}]}]}]}))
    assert req.messages[0]["content"] == "Notes\nalpha\nHit\nbeta"
