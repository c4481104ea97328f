"""Responses API events and the response object, built from parsed message deltas.

One ``ResponseBuilder`` per response: it opens and closes output items as the
parser reports reasoning, text and tool calls, numbers every event, and produces
the final response object, so the SSE stream, the WebSocket and the non-streamed
HTTP answer are the same objects.

Every event is a snapshot of the moment it is sent: items and parts inside events
are copies, never the objects the builder goes on changing. Each item follows the
Responses state machine: ``output_item.added`` (empty, ``in_progress``) → its
content events (``content_part.added`` → deltas → ``.done`` for messages; argument
or input deltas → ``.done`` for calls) → ``output_item.done`` → the response's
terminal event. A tool call is opened as soon as the parser knows its name.
Calls of ``custom`` tools become ``custom_tool_call`` items, of ``local_shell``
``local_shell_call`` items, of namespaced tools items carrying the ``namespace``.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.responses.request import OfferedTool
from parsers import json_text
from parsers.message_stream import CallChunk, MessageDelta, ToolCall

Event = dict[str, Any]
ITEM_PREFIX = {"function": "fc", "custom": "ctc", "local_shell": "lsh"}
ITEM_TYPE = {"function": "function_call", "custom": "custom_tool_call",
             "local_shell": "local_shell_call"}


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


@dataclass
class ResponseBuilder:
    response_id: str
    model: str
    echo: dict[str, Any]  # request fields echoed in the response object
    offered: dict[str, OfferedTool] = field(default_factory=dict)  # by model-facing name
    seal: Callable[[str], str] | None = None  # set: reasoning items get encrypted_content
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "in_progress"
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    _seq: int = 0
    _open: dict[str, Any] | None = None  # the reasoning or message item being written
    _text: str = ""
    _call: dict[str, Any] | None = None  # the tool call item being written
    _call_args: str = ""

    def response(self) -> dict[str, Any]:
        return {"id": self.response_id, "object": "response", "created_at": self.created_at,
                "status": self.status, "model": self.model, "output": self.output,
                "usage": self.usage, "incomplete_details": self.incomplete_details,
                "error": self.error, **self.echo}

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _snapshot(self, kind: str, **fields: Any) -> Event:
        """An event holding items, parts or the response: a deep copy as of now."""
        return self._event(kind, **copy.deepcopy(fields))

    def start(self) -> list[Event]:
        return [self._snapshot("response.created", response=self.response()),
                self._snapshot("response.in_progress", response=self.response())]

    # -- reasoning and message items -------------------------------------------------------
    def _index(self) -> int:
        return len(self.output) - 1

    def _open_item(self, item: dict[str, Any]) -> list[Event]:
        self.output.append(item)
        self._open, self._text = item, ""
        events = [self._snapshot("response.output_item.added", output_index=self._index(),
                                 item=item)]
        if item["type"] == "message":
            events.append(self._snapshot("response.content_part.added", item_id=item["id"],
                                         output_index=self._index(), content_index=0,
                                         part={"type": "output_text", "text": "",
                                               "annotations": [], "logprobs": []}))
        return events

    def _close_item(self, status: str = "completed") -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        i, text = self.output.index(item), self._text
        events: list[Event] = []
        if item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            if self.seal is not None:
                item["encrypted_content"] = self.seal(text)
            events.append(self._event("response.reasoning_text.done", item_id=item["id"],
                                      output_index=i, content_index=0, text=text))
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            events += [self._event("response.output_text.done", item_id=item["id"],
                                   output_index=i, content_index=0, text=text, logprobs=[]),
                       self._snapshot("response.content_part.done", item_id=item["id"],
                                      output_index=i, content_index=0, part=part)]
        item["status"] = status
        events.append(self._snapshot("response.output_item.done", output_index=i, item=item))
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
        finished = {c.id: c for c in delta.tool_calls}
        for part in delta.calls:
            events += self._call_part(part, finished.get(part.id))
        return events

    # -- tool call items --------------------------------------------------------------------
    def _offered(self, name: str) -> OfferedTool:
        return self.offered.get(name) or OfferedTool("function", name)

    def _call_part(self, part: CallChunk, final: ToolCall | None) -> list[Event]:
        events: list[Event] = []
        if part.name:
            events += self._close_item()
            spec = self._offered(part.name)
            item: dict[str, Any] = {"id": new_item_id(ITEM_PREFIX[spec.kind]),
                                    "type": ITEM_TYPE[spec.kind], "status": "in_progress",
                                    "call_id": part.id}
            if spec.kind == "function":
                item.update(name=spec.name, arguments="")
            elif spec.kind == "custom":
                item.update(name=spec.name, input="")
            else:
                item["action"] = {"type": "exec", "command": [], "env": {}}
            if spec.namespace:
                item["namespace"] = spec.namespace
            self.output.append(item)
            self._call, self._call_args = item, ""
            events.append(self._snapshot("response.output_item.added",
                                         output_index=self._index(), item=item))
        call = self._call
        if call is None:
            return events
        i = self.output.index(call)
        if part.arguments:
            self._call_args += part.arguments
            if call["type"] == "function_call":
                call["arguments"] += part.arguments
                events.append(self._event("response.function_call_arguments.delta",
                                          item_id=call["id"], output_index=i,
                                          delta=part.arguments))
        if part.done:
            events += self._close_call(call, i, final.complete if final is not None else True)
        return events

    def _close_call(self, item: dict[str, Any], i: int, complete: bool) -> list[Event]:
        args = self._call_args
        events: list[Event] = []
        if item["type"] == "function_call":
            events.append(self._event("response.function_call_arguments.done",
                                      item_id=item["id"], output_index=i, name=item["name"],
                                      arguments=args))
        elif item["type"] == "custom_tool_call":
            text = json_text.custom_input(args)
            item["input"] = text
            events += [self._event("response.custom_tool_call_input.delta", item_id=item["id"],
                                   output_index=i, delta=text),
                       self._event("response.custom_tool_call_input.done", item_id=item["id"],
                                   output_index=i, input=text)]
        else:
            parsed = _json_object(args)
            command = parsed.get("command")
            if isinstance(command, str):
                command = ["bash", "-lc", command]
            action: dict[str, Any] = {"type": "exec", "env": {}, "command": [
                str(c) for c in command] if isinstance(command, list) else []}
            if isinstance(parsed.get("workdir"), str):
                action["working_directory"] = parsed["workdir"]
            if isinstance(parsed.get("timeout_ms"), int):
                action["timeout_ms"] = parsed["timeout_ms"]
            item["action"] = action
        item["status"] = "completed" if complete else "incomplete"
        self._call = None
        events.append(self._snapshot("response.output_item.done", output_index=i, item=item))
        return events

    # -- the end ----------------------------------------------------------------------------
    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> list[Event]:
        cut = finish_reason == "length"
        events = self._close_item("incomplete" if cut else "completed")
        self.usage = usage
        if cut:
            self.status = "incomplete"
            self.incomplete_details = {"reason": "max_output_tokens"}
            return [*events, self._snapshot("response.incomplete", response=self.response())]
        self.status = "completed"
        return [*events, self._snapshot("response.completed", response=self.response())]

    def fail(self, message: str, code: str = "server_error") -> list[Event]:
        events = self._close_item("incomplete")
        if self._call is not None:
            events += self._close_call(self._call, self.output.index(self._call), False)
        self.status = "failed"
        self.error = {"code": code, "message": message}
        return [*events, self._snapshot("response.failed", response=self.response())]


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json_text.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

