"""Responses API events built from parsed deltas, with no model."""

from __future__ import annotations

from api.response_events import ResponseBuilder
from parsers.message_stream import MessageDelta, ToolCall


def test_reasoning_then_text_then_calls_open_and_close_items_in_order() -> None:
    b = ResponseBuilder("resp_1", "m", {"store": True})
    events = b.start()
    events += b.add(MessageDelta(reasoning="Think"))
    events += b.add(MessageDelta(reasoning="ing."))
    events += b.add(MessageDelta(content="Hi"))
    events += b.add(MessageDelta(content="!", tool_calls=[ToolCall("call_1", "f", "{}")]))
    events += b.finish("stop", {"input_tokens": 3})
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "Thinking."}]
    assert final["output"][1]["content"][0]["text"] == "Hi!"
    assert [e["output_index"] for e in events if e["type"].endswith("item.done")] == [0, 1, 2]
    assert final["status"] == "completed" and final["store"] is True


def test_incomplete_and_failed_terminals() -> None:
    b = ResponseBuilder("resp_2", "m", {})
    b.start()
    b.add(MessageDelta(content="Once upon"))
    (*_, last) = b.finish("length", {})
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "completed"
    f = ResponseBuilder("resp_3", "m", {})
    f.start()
    (last,) = f.fail("boom")
    assert last["type"] == "response.failed" and last["response"]["error"]["message"] == "boom"
