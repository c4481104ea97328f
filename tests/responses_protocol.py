"""The Responses API streaming state machine, checked over a whole event sequence.

Used on events built in-process and on events read from a real server over SSE
and WebSocket. Every event must be a snapshot of its moment: an
``output_item.added`` item is empty and ``in_progress`` (a builder that changes the
item after handing it out fails here), deltas join to the ``.done`` values, items
do not interleave, and the terminal response's output equals the items' final
snapshots.
"""

from __future__ import annotations

from typing import Any

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
DELTA = {"message": "response.output_text.delta",
         "reasoning": "response.reasoning_text.delta",
         "function_call": "response.function_call_arguments.delta",
         "custom_tool_call": "response.custom_tool_call_input.delta"}
DONE = {"message": "response.output_text.done",
        "reasoning": "response.reasoning_text.done",
        "function_call": "response.function_call_arguments.done",
        "custom_tool_call": "response.custom_tool_call_input.done"}
DONE_FIELD = {"message": "text", "reasoning": "text", "function_call": "arguments",
              "custom_tool_call": "input"}


def _empty(item: dict[str, Any]) -> bool:
    kind = item["type"]
    if kind in ("message", "reasoning"):
        return item.get("content") in ([], None)
    if kind == "function_call":
        return item["arguments"] == "" and bool(item["name"]) and bool(item["call_id"])
    if kind == "custom_tool_call":
        return item["input"] == "" and bool(item["name"]) and bool(item["call_id"])
    if kind == "local_shell_call":
        return item["action"]["command"] == [] and bool(item["call_id"])
    raise AssertionError(f"unknown item type {kind}")


def check_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Assert the sequence is a valid Responses stream; returns the terminal response."""
    assert events, "no events"
    assert [e["sequence_number"] for e in events] == list(range(len(events))), \
        "sequence_number must count up from 0"
    assert events[0]["type"] == "response.created", events[0]["type"]
    assert events[1]["type"] == "response.in_progress", events[1]["type"]
    assert events[-1]["type"] in TERMINAL, events[-1]["type"]
    assert all(e["type"] not in TERMINAL for e in events[:-1]), "events after the terminal"
    items: list[dict[str, Any]] = []  # final snapshots
    i = 2
    while i < len(events) - 1:
        added = events[i]
        assert added["type"] == "response.output_item.added", (i, added["type"])
        item = added["item"]
        index = added["output_index"]
        assert index == len(items), "output_index must follow the items"
        assert item["status"] == "in_progress", f"added item not in_progress: {item}"
        assert _empty(item), f"added item is not empty: {item}"
        kind = item["type"]
        i += 1
        if kind == "message":
            assert events[i]["type"] == "response.content_part.added", events[i]["type"]
            assert events[i]["part"]["text"] == ""
            i += 1
        pieces = []
        while events[i]["type"] == DELTA.get(kind):
            assert events[i]["output_index"] == index and events[i]["item_id"] == item["id"]
            pieces.append(events[i]["delta"])
            i += 1
        joined = "".join(pieces)
        if kind in DONE:
            done = events[i]
            assert done["type"] == DONE[kind], (kind, done["type"])
            assert done[DONE_FIELD[kind]] == joined, "deltas do not join to the .done value"
            i += 1
        if kind == "message":
            assert events[i]["type"] == "response.content_part.done", events[i]["type"]
            assert events[i]["part"]["text"] == joined
            i += 1
        done_item = events[i]
        assert done_item["type"] == "response.output_item.done", (kind, done_item["type"])
        assert done_item["output_index"] == index
        final = done_item["item"]
        assert final["id"] == item["id"] and final["type"] == kind
        assert final["status"] in ("completed", "incomplete"), final["status"]
        if kind == "message":
            assert final["content"][0]["text"] == joined
        elif kind in ("function_call", "custom_tool_call"):
            assert final[DONE_FIELD[kind]] == joined
            assert final["call_id"] == item["call_id"] and final["name"] == item["name"]
        items.append(final)
        i += 1
    response: dict[str, Any] = events[-1]["response"]
    assert response["output"] == items, "terminal output differs from the items' snapshots"
    return response
