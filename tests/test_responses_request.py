"""Responses requests → chat messages and tools, with no model: every tool and item
type, and any body shaped like one is a request or a 400, never anything else."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.chat.messages import parse_messages
from api.responses.reasoning_seal import ReasoningSeal
from api.responses.request import LOCAL_SHELL, parse_request
from api.web.errors import APIError
from api.web.params import Body


def test_tools_of_every_kind_map_to_functions_and_back() -> None:
    req = parse_request(Body({"input": "x", "tools": [
        {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "ns", "description": "n", "tools": [
            {"type": "function", "name": "g"}, {"type": "custom", "name": "h"}]},
        {"type": "custom", "name": "apply_patch",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"x\""}},
        {"type": "local_shell"}, {"type": "web_search", "external_web_access": True},
        {"type": "mcp", "server_label": "s"}]}))
    names = [t["function"]["name"] for t in req.chat_body["tools"]]
    assert names == ["f", "ns__g", "ns__h", "apply_patch", LOCAL_SHELL]
    assert list(req.chat_body["tools"][0]["function"]) == ["name", "description", "parameters"]
    assert req.offered["ns__h"].kind == "custom" and req.offered["ns__h"].namespace == "ns"
    patch = req.chat_body["tools"][3]["function"]
    assert patch["parameters"]["required"] == ["input"] and 'start: "x"' in patch["description"]


def test_items_render_as_the_chat_conversation_would() -> None:
    seal = ReasoningSeal("k" * 32, "m")
    req = parse_request(Body({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                     {"type": "input_image", "image_url": "x"}]},
        {"type": "reasoning", "id": "r", "summary": [], "encrypted_content": seal.seal("hmm")},
        {"type": "function_call", "call_id": "c1", "name": "g", "namespace": "ns",
         "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "ok"}]},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "P"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
        {"type": "local_shell_call", "call_id": "c3",
         "action": {"type": "exec", "command": ["ls"], "working_directory": "/"}},
        {"type": "local_shell_call_output", "call_id": "c3", "output": "a b"},
        {"type": "web_search_call", "id": "w"}, {"type": "item_reference", "id": "i"}]}),
        seal.open)
    m = req.input_messages
    # media parts stay parts (each names its place for errors) until chat's normalization
    # flattens them: a marker with a projector, else a placeholder
    assert m[0]["role"] == "user"
    assert [(p["type"], p["_where"]) for p in m[0]["content"]] == [
        ("input_text", "input[0].content[0]"), ("input_image", "input[0].content[1]")]
    assert parse_messages(Body({"messages": m[:1]}))[0]["content"] == \
        "hi\n[image omitted: this model does not read it]"
    assert m[1]["reasoning_content"] == "hmm"
    assert m[1]["tool_calls"][0]["function"] == {"name": "ns__g", "arguments": '{"a": 1}'}
    assert m[2] == {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    assert json.loads(m[3]["tool_calls"][0]["function"]["arguments"]) == {"input": "P"}
    assert json.loads(m[5]["tool_calls"][0]["function"]["arguments"]) == {
        "command": ["ls"], "workdir": "/"}
    assert [x["role"] for x in m] == ["user", "assistant", "tool", "assistant", "tool",
                                      "assistant", "tool"]


def test_a_sealed_reasoning_opens_only_with_its_key_and_model() -> None:
    token = ReasoningSeal("k" * 32, "m").seal("secret thoughts")
    assert ReasoningSeal("k" * 32, "m").open(token) == "secret thoughts"
    assert ReasoningSeal("j" * 32, "m").open(token) is None
    assert ReasoningSeal("k" * 32, "other").open(token) is None
    assert ReasoningSeal("k" * 32, "m").open(token[:-2] + "AA") is None
    assert all(ReasoningSeal("k" * 32, "m").open(bad) is None
               for bad in (None, 5, "", "!!!", "AAAA", "x" * 10_000_000))


ITEM_TYPES = ["message", "function_call", "function_call_output", "custom_tool_call",
              "custom_tool_call_output", "local_shell_call", "local_shell_call_output",
              "reasoning", "web_search_call", "item_reference", "bogus"]
TOOL_TYPES = ["function", "custom", "namespace", "local_shell", "web_search", "mcp", "bogus"]
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5),
              st.sampled_from(ITEM_TYPES + TOOL_TYPES + ["user", "assistant", "input_text"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(
                                ["type", "role", "content", "text", "name", "arguments",
                                 "output", "call_id", "input", "action", "command", "tools",
                                 "namespace", "summary", "encrypted_content", "format"]),
                                inner, max_size=4)),
    max_leaves=20)


@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["input", "tools", "tool_choice", "include", "text",
                                        "reasoning", "instructions"]), VALUES, max_size=5))
def test_any_shape_is_a_request_or_a_400(body: dict[str, Any]) -> None:
    try:
        parse_request(Body(body), ReasoningSeal(None, "m").open)
    except APIError as exc:
        assert exc.status == 400
