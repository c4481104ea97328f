"""Responses API events and the response object, built from parsed message deltas.

One ``ResponseBuilder`` per response: it opens and closes output items as the
parser reports reasoning, text and tool calls (a reasoning item, then a message
item, then one function_call item per call), numbers every event, and produces
the final response object, so the SSE stream, the WebSocket and the
non-streamed HTTP answer are the same objects.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from parsers.message_stream import MessageDelta

Event = dict[str, Any]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


@dataclass
class ResponseBuilder:
    response_id: str
    model: str
    echo: dict[str, Any]  # request fields echoed in the response object
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "in_progress"
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    _seq: int = 0
    _open: dict[str, Any] | None = None  # the reasoning or message item being written
    _text: str = ""

    def response(self) -> dict[str, Any]:
        return {"id": self.response_id, "object": "response", "created_at": self.created_at,
                "status": self.status, "model": self.model, "output": self.output,
                "usage": self.usage, "incomplete_details": self.incomplete_details,
                "error": self.error, **self.echo}

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def start(self) -> list[Event]:
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    # -- items ----------------------------------------------------------------------------
    def _index(self) -> int:
        return len(self.output) - 1

    def _open_item(self, item: dict[str, Any]) -> list[Event]:
        self.output.append(item)
        self._open, self._text = item, ""
        events = [self._event("response.output_item.added", output_index=self._index(),
                              item=item)]
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", item_id=item["id"],
                                      output_index=self._index(), content_index=0,
                                      part={"type": "output_text", "text": "",
                                            "annotations": []}))
        return events

    def _close_item(self) -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        i, text = self._index(), self._text
        events: list[Event] = []
        if item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            events.append(self._event("response.reasoning_text.done", item_id=item["id"],
                                      output_index=i, content_index=0, text=text))
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            events += [self._event("response.output_text.done", item_id=item["id"],
                                   output_index=i, content_index=0, text=text, logprobs=[]),
                       self._event("response.content_part.done", item_id=item["id"],
                                   output_index=i, content_index=0, part=part)]
        item["status"] = "completed"
        events.append(self._event("response.output_item.done", output_index=i, item=item))
        return events

    def add(self, delta: MessageDelta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            if self._open is None or self._open["type"] != "reasoning":
                events += self._close_item()
                events += self._open_item({"id": new_item_id("rs"), "type": "reasoning",
                                           "summary": [], "content": [],
                                           "status": "in_progress"})
            assert self._open is not None
            self._text += delta.reasoning
            events.append(self._event("response.reasoning_text.delta",
                                      item_id=self._open["id"], output_index=self._index(),
                                      content_index=0, delta=delta.reasoning))
        if delta.content:
            if self._open is None or self._open["type"] != "message":
                events += self._close_item()
                events += self._open_item({"id": new_item_id("msg"), "type": "message",
                                           "role": "assistant", "status": "in_progress",
                                           "content": []})
            assert self._open is not None
            self._text += delta.content
            events.append(self._event("response.output_text.delta", item_id=self._open["id"],
                                      output_index=self._index(), content_index=0,
                                      delta=delta.content, logprobs=[]))
        for call in delta.tool_calls:
            events += self._close_item()
            item = {"id": new_item_id("fc"), "type": "function_call", "call_id": call.id,
                    "name": call.name, "arguments": "", "status": "in_progress"}
            events += self._open_item(item)
            self._open = None
            i = self._index()
            events.append(self._event("response.function_call_arguments.delta",
                                      item_id=item["id"], output_index=i, delta=call.arguments))
            item["arguments"], item["status"] = call.arguments, "completed"
            events.append(self._event("response.function_call_arguments.done",
                                      item_id=item["id"], output_index=i, name=call.name,
                                      arguments=call.arguments))
            events.append(self._event("response.output_item.done", output_index=i, item=item))
        return events

    # -- the end --------------------------------------------------------------------------
    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> list[Event]:
        events = self._close_item()
        self.usage = usage
        if finish_reason == "length":
            self.status = "incomplete"
            self.incomplete_details = {"reason": "max_output_tokens"}
            return [*events, self._event("response.incomplete", response=self.response())]
        self.status = "completed"
        return [*events, self._event("response.completed", response=self.response())]

    def fail(self, message: str, code: str = "server_error") -> list[Event]:
        events = self._close_item()
        self.status = "failed"
        self.error = {"code": code, "message": message}
        return [*events, self._event("response.failed", response=self.response())]
