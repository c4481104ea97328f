"""An Anthropic Messages request, translated to the chat machinery.

``system`` (a string or text blocks) becomes the system message; ``messages`` become
chat messages: ``text`` blocks join into the content, ``tool_use`` blocks become the
assistant's tool calls, ``tool_result`` blocks become ``tool`` messages (before the
rest of their user turn), ``thinking`` blocks the assistant's ``reasoning_content``;
``image`` and ``document`` blocks become a placeholder without a projector. ``tools``
(``input_schema``) become function tools; server tools this server cannot run
(``web_search_…``, ``code_execution_…``, ``bash_…`` with a ``type``) are left out.
``output_config.format`` (``json_schema``) is structured output, as ``response_format``
in chat. Unknown fields such as ``cache_control`` are ignored. The conversation then
goes through the same normalization as chat, so it renders to the same prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from api.chat.messages import part_text
from api.web.errors import invalid
from api.web.params import Body

CLIENT_TOOL_TYPES = (None, "custom")
ROLES = ("user", "assistant", "system")
# content blocks of server tools (run by Anthropic's API, not here) in an assistant turn;
# their results are every block type ending in "_tool_result" but "tool_result"
SERVER_TOOL_BLOCKS = ("server_tool_use", "mcp_tool_use", "container_upload")
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}
CLEAR_THINKING = "clear_thinking_20251015"
BILLING_HEADER = "x-anthropic-billing-header:"


@dataclass(frozen=True)
class MessagesRequest:
    messages: list[dict[str, Any]]  # chat messages, system first
    chat_body: dict[str, Any]  # tools, tool_choice, sampling: chat-completions names
    extra: dict[str, Any] = field(default_factory=dict)  # chat template kwargs (thinking)
    stream: bool = False


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(where, "'content' must be a string or a list of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid(f"{where}[{i}]", "content blocks must be objects with a 'type'")
    return content


def _text(block: dict[str, Any], where: str) -> str:
    kind = block["type"]
    if kind == "text":
        return part_text(block, where)
    source = block.get("source")
    if kind == "document" and isinstance(source, dict):  # plain-text documents are read
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return _titled(block, source["data"])
        if source.get("type") == "content":
            return _titled(block, "\n".join(
                _text(b, f"{where}.source.content[{i}]")
                for i, b in enumerate(_blocks(source.get("content"), f"{where}.source"))))
    if kind == "search_result":
        return _titled(block, "\n".join(
            _text(b, f"{where}.content[{i}]")
            for i, b in enumerate(_blocks(block.get("content"), f"{where}.content"))))
    if kind in ("image", "document"):
        return part_text({"type": "input_image" if kind == "image" else "input_file"}, where)
    raise invalid(where, f"content block type {kind!r} is not allowed here")


def _titled(block: dict[str, Any], text: str) -> str:
    title = block.get("title")
    return f"{title}\n{text}" if isinstance(title, str) and title else text


def _image_url(block: dict[str, Any]) -> str | None:
    """An image block's source as a URL (base64 as a data: URL); None if it has none."""
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media_type = source.get("media_type")
        return f"data:{media_type if isinstance(media_type, str) else 'image/png'};base64," \
            f"{source['data']}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    return None


def _tool_result(block: dict[str, Any], where: str, loaded: set[str]) -> dict[str, Any]:
    content = block.get("content", "")
    texts = []
    for i, b in enumerate([] if isinstance(content, str) else
                          _blocks(content, f"{where}.content")):
        if b["type"] == "tool_reference" and isinstance(b.get("tool_name"), str):
            loaded.add(b["tool_name"])  # a tool search found it: its definition is loaded
            texts.append(f"Tool loaded: {b['tool_name']}")
        else:
            texts.append(_text(b, f"{where}.content[{i}]"))
    text = content if isinstance(content, str) else "\n".join(texts)
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}


def _turn(i: int, message: Any, loaded: set[str]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages; names of deferred tools its tool results
    load (``tool_reference`` blocks, from a tool search) are added to ``loaded``."""
    where = f"messages[{i}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise invalid(f"{where}.role", "each message needs a 'role' of 'user', 'assistant' "
                      "or 'system'")
    role = message["role"]
    if role == "system":  # a mid-conversation system turn (placed by the chat template)
        return [{"role": "system", "content": "\n".join(
            _text(b, f"{where}.content[{j}]")
            for j, b in enumerate(_blocks(message.get("content"), f"{where}.content")))}]
    texts: list[str] = []
    parts: list[dict[str, Any]] = []  # user text and images as chat content parts
    out: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for j, block in enumerate(_blocks(message.get("content"), f"{where}.content")):
        at = f"{where}.content[{j}]"
        kind = block["type"]
        if kind == "tool_result" and role == "user":
            out.append(_tool_result(block, at, loaded))
        elif kind in SERVER_TOOL_BLOCKS or kind.endswith("_tool_result"):
            continue  # a server tool's call or result (web search …): not run here
        elif kind == "tool_use" and role == "assistant":
            name, args = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise invalid(at, "tool_use blocks need a 'name' and an 'input' object")
            calls.append({"id": block.get("id") or f"toolu_{i}_{j}", "type": "function",
                          "function": {"name": name,
                                       "arguments": json.dumps(args, ensure_ascii=False)}})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            if isinstance(block.get("thinking"), str) and block["thinking"]:
                thinking.append(block["thinking"])
        elif kind == "image" and role == "user" and _image_url(block) is not None:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)},
                          "_where": f"{at}.source"})
        else:
            texts.append(_text(block, at))
            parts.append({"type": "text", "text": texts[-1]})
    if role == "user":
        if len(parts) > len(texts):  # images: chat parts, each in its place
            out.append({"role": "user", "content": parts})
        elif texts or not out:
            out.append({"role": "user", "content": "\n".join(texts)})
        return out
    turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
    if calls:
        turn["tool_calls"] = calls
    if thinking:
        turn["reasoning_content"] = "\n".join(thinking)
    if turn["content"] is None and not calls:
        turn["content"] = ""
    return [turn]


def _system(raw: Any) -> str | None:
    """The system prompt's text. Claude Code's ``x-anthropic-billing-header`` block is left
    out: it is metadata for Anthropic's billing, not an instruction, and it carries a
    fingerprint of the conversation's first message, so keeping it would make every new
    conversation miss the prefix cache from its first tokens on."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    texts = [_text(b, f"system[{i}]") for i, b in enumerate(_blocks(raw, "system"))]
    return "\n".join(t for t in texts if not t.startswith(BILLING_HEADER))


def _tools(raw: Any, loaded: set[str]) -> list[dict[str, Any]]:
    """Client tools as chat function tools. A tool with ``defer_loading`` stays out of the
    prompt until a tool search loads it (a ``tool_reference`` in a tool result)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("tools", "'tools' must be a list")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise invalid(f"tools[{i}]", "each tool must be an object")
        if tool.get("type") not in CLIENT_TOOL_TYPES:
            continue  # a server tool (web search, code execution …): not run here
        if tool.get("defer_loading") is True and tool.get("name") not in loaded:
            continue
        name, schema = tool.get("name"), tool.get("input_schema", {"type": "object"})
        if not isinstance(name, str) or not name or not isinstance(schema, dict):
            raise invalid(f"tools[{i}]", "each tool needs a 'name' and an 'input_schema' "
                          "object")
        fn: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        fn["parameters"] = schema
        if tool.get("strict") is True:  # structured tool inputs: enforced or refused
            fn["strict"] = True
        tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(raw: Any, chat: dict[str, Any]) -> None:
    if raw is None:
        return
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise invalid("tool_choice", "'tool_choice.type' must be 'auto', 'any', 'tool' or "
                      "'none'")
    assert isinstance(raw, dict)
    if kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": raw.get("name")}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if raw.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def _clear_thinking(raw: Any, messages: list[dict[str, Any]]) -> None:
    """Apply ``context_management``'s ``clear_thinking`` edit: the thinking of all but the
    last ``keep`` assistant turns with thinking is dropped (``"all"`` keeps every one).
    Other edits (``clear_tool_uses_…``) are accepted and not applied: a prompt that does
    not fit the context gets the usual error, and clients compact their own history."""
    if raw is None:
        return
    edits = raw.get("edits") if isinstance(raw, dict) else None
    if not isinstance(edits, list) or not all(isinstance(e, dict) for e in edits):
        raise invalid("context_management.edits", "'edits' must be a list of objects")
    for i, edit in enumerate(edits):
        if edit.get("type") != CLEAR_THINKING:
            continue
        keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
        if keep == "all":
            continue
        value = keep.get("value") if isinstance(keep, dict) else None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise invalid(f"context_management.edits[{i}].keep",
                          "'keep' must be 'all' or {'type': 'thinking_turns', 'value': n}")
        thinking = [m for m in messages if m.get("reasoning_content")]
        for m in thinking[:len(thinking) - value]:
            del m["reasoning_content"]


def parse_messages_request(body: Body, *, count_only: bool = False) -> MessagesRequest:
    data = body.data
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "'messages' must be a non-empty list")
    messages: list[dict[str, Any]] = []
    system = _system(data.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    loaded: set[str] = set()  # deferred tools a tool search has loaded
    for i, m in enumerate(raw):
        messages += _turn(i, m, loaded)
    _clear_thinking(data.get("context_management"), messages)
    chat: dict[str, Any] = {}
    if not count_only:
        max_tokens = body.integer("max_tokens", None, 1)
        if max_tokens is None:
            raise invalid("max_tokens", "'max_tokens' is required")
        chat["max_tokens"] = max_tokens
        for name in ("temperature", "top_p", "top_k"):
            if data.get(name) is not None:
                chat[name] = data[name]
        stops = data.get("stop_sequences")
        if stops is not None:
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise invalid("stop_sequences", "'stop_sequences' must be a list of strings")
            chat["stop"] = stops
    for name in ("model", "lora"):  # which LoRA adapters (api.web.lora)
        if data.get(name) is not None:
            chat[name] = data[name]
    tools = _tools(data.get("tools"), loaded)
    if tools:
        chat["tools"] = tools
    _tool_choice(data.get("tool_choice"), chat)
    if "tool_choice" in chat and not tools and chat["tool_choice"] != "none":
        del chat["tool_choice"]
    output = data.get("output_config")
    if output is not None and not isinstance(output, dict):
        raise invalid("output_config", "'output_config' must be an object")
    fmt = output.get("format") if isinstance(output, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise invalid("output_config.format.schema", "a json_schema format needs a "
                          "'schema' object")
        # Anthropic's structured outputs are a guarantee: enforced exactly or refused
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": fmt["schema"], "strict": True}}
    extra: dict[str, Any] = {}
    thinking = data.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled",
                                                                "adaptive"):
        extra["enable_thinking"] = thinking["type"] != "disabled"
        budget = thinking.get("budget_tokens")
        if budget is not None and thinking["type"] != "disabled":
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
                raise invalid("thinking.budget_tokens",
                              "'thinking.budget_tokens' must be a non-negative integer")
            chat["thinking_budget_tokens"] = budget
    effort = output.get("effort") if isinstance(output, dict) else None
    if effort is not None:
        if effort not in EFFORTS:
            raise invalid("output_config.effort", "'effort' must be one of "
                          + ", ".join(repr(e) for e in EFFORTS))
        extra["reasoning_effort"] = EFFORTS[effort]  # the templates' name (gpt-oss …)
    return MessagesRequest(messages, chat, extra, body.boolean("stream", False))
