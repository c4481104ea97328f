"""A Responses API request, translated to the chat machinery.

``input`` items become chat messages: ``message`` (string or ``input_text`` /
``output_text`` parts), ``function_call`` (an assistant message with tool calls),
``function_call_output`` (a ``tool`` message); ``reasoning`` items are accepted and
not sent back to the model. ``instructions`` is a system message for this turn
only (as OpenAI: it is not inherited through ``previous_response_id``). Function
tools are flattened Responses-style; other tool types are a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from api.errors import invalid
from api.params import Body

TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class ResponseRequest:
    input_messages: list[dict[str, Any]]  # this turn's input, as chat messages
    instructions: str | None
    chat_body: dict[str, Any]  # tools, sampling, format: chat-completions field names
    echo: dict[str, Any]  # fields the response object repeats
    previous_response_id: str | None = None
    store: bool = True
    generate: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}.content", "'content' must be a string or a list of parts")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or \
                not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else None
            raise invalid(f"{where}.content[{i}]", f"content part type {kind!r} is not "
                          "supported (input_text / output_text only)")
        texts.append(part["text"])
    return "\n".join(texts)


def input_messages(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise invalid("input", "'input' must be a string or a list of items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise invalid(f"{where}.role", f"unknown role {role!r}")
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments", "{}")
            if not isinstance(name, str) or not isinstance(args, str):
                raise invalid(where, "function_call items need a 'name' and 'arguments' string")
            call = {"id": item.get("call_id") or item.get("id") or f"call_{i}",
                    "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = json.dumps(output)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind == "reasoning":
            continue
        else:
            raise invalid(f"{where}.type", f"input item type {kind!r} is not supported")
    return out


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise invalid("tools", "'tools' must be a list")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise invalid(f"tools[{i}]", f"tool type {kind!r} is not supported: only "
                          "function tools run on this server")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(raw: Any) -> Any:
    if isinstance(raw, dict) and raw.get("type") == "function":
        return {"type": "function", "function": {"name": raw.get("name")}}
    return raw


def _format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid("text.format", "'text.format' must be an object")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt.get("schema"),
            "strict": fmt.get("strict", False)}}
    if fmt.get("type") in ("text", "json_object"):
        return {"type": fmt["type"]}
    raise invalid("text.format", "'text.format.type' must be 'text', 'json_object' or "
                  "'json_schema'")


def parse_request(body: Body) -> ResponseRequest:
    data = body.data
    if "input" not in data and not data.get("previous_response_id"):
        raise invalid("input", "'input' is required")
    messages = input_messages(data.get("input", []))
    instructions = body.string("instructions")
    chat: dict[str, Any] = {}
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"),
                     ("max_output_tokens", "max_tokens"), ("parallel_tool_calls",
                                                           "parallel_tool_calls"),
                     ("seed", "seed"), ("top_k", "top_k"), ("min_p", "min_p")):
        if data.get(src) is not None:
            chat[dst] = data[src]
    tools = _tools(data.get("tools"))
    if tools:
        chat["tools"] = tools
    if data.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(data["tool_choice"])
    fmt = _format(data.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    reasoning = data.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    metadata = body.obj("metadata") or {}
    previous = body.string("previous_response_id")
    store = body.boolean("store", True)
    echo = {"instructions": instructions, "max_output_tokens": data.get("max_output_tokens"),
            "metadata": metadata, "parallel_tool_calls": data.get("parallel_tool_calls", True),
            "previous_response_id": previous, "store": store,
            "temperature": data.get("temperature"), "top_p": data.get("top_p"),
            "text": data.get("text") or {"format": {"type": "text"}},
            "tool_choice": data.get("tool_choice", "auto"), "tools": data.get("tools") or [],
            "reasoning": reasoning, "truncation": "disabled"}
    return ResponseRequest(messages, instructions, chat, echo, previous, store,
                           body.boolean("generate", True), metadata)
