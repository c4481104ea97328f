"""A Responses API request, translated to the chat machinery.

Every tool type and input item type of the Responses API is accepted:

- tools: ``function`` tools are offered as they are; ``function`` and ``custom`` tools
  inside a ``namespace`` are offered as ``<namespace>__<name>`` and their calls come
  back carrying the namespace; ``custom`` (freeform) tools are offered as a function
  with one string argument ``input`` (a ``lark`` / ``regex`` grammar is shown to the
  model in the description and enforced on the input, ``engine.constraints.lark_rules``; a grammar
  it cannot read is a 400); ``local_shell`` is offered as a function
  taking ``command`` (a list of strings), ``workdir`` and ``timeout_ms``. Hosted tools
  this server cannot run (``web_search``, ``file_search``, ``image_generation``,
  ``code_interpreter``, ``tool_search``, ``mcp``, ``computer_use_preview``…) are left
  out of the prompt.
- input items: ``message`` (text parts; images, audio and files become a placeholder
  without a projector), ``function_call`` / ``custom_tool_call`` / ``local_shell_call``
  (an assistant message with tool calls, named as they were offered) and their
  ``*_output`` items (``tool`` messages; an ``output`` given as content parts is
  rendered as its text), ``reasoning`` (its text, or its opened ``encrypted_content``,
  goes with the next assistant message as ``reasoning_content``); hosted tools' call
  items and ``item_reference`` are accepted and left out.

``instructions`` is a system message for this turn only (as OpenAI: it is not
inherited through ``previous_response_id``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.chat.messages import content_text, has_media
from api.chat.tools import custom_parameters
from api.web.errors import invalid
from api.web.params import Body

HOSTED_TOOLS = {"web_search", "web_search_preview", "web_search_preview_2025_03_11",
                "file_search", "image_generation", "code_interpreter", "tool_search", "mcp",
                "computer_use_preview", "computer", "shell", "apply_patch"}
HOSTED_ITEMS = {"web_search_call", "file_search_call", "image_generation_call",
                "code_interpreter_call", "tool_search_call", "tool_search_output",
                "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
                "computer_call", "computer_call_output", "shell_call", "shell_call_output",
                "apply_patch_call", "apply_patch_call_output", "item_reference",
                "compaction", "compaction_summary"}
SEPARATOR = "__"  # between a namespace and a tool name, in the name the model sees
LOCAL_SHELL = "local_shell"
LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"},
                    "description": "The command and its arguments, e.g. [\"ls\", \"-la\"]"},
        "workdir": {"type": "string", "description": "Directory to run the command in"},
        "timeout_ms": {"type": "integer", "description": "Time limit in milliseconds"}},
    "required": ["command"]}


@dataclass(frozen=True)
class OfferedTool:
    """What the client offered under a name the model sees."""

    kind: str  # "function", "custom" or "local_shell"
    name: str  # the client's own name
    namespace: str | None = None


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
    offered: dict[str, OfferedTool] = field(default_factory=dict)  # by model-facing name
    include: frozenset[str] = frozenset()
    raw_input: Any = None  # ``input`` as the client sent it (listed by GET .../input_items)
    conversation: str | None = None  # the Conversations API's conversation it continues


def model_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


Opener = Callable[[object], str | None]  # opens a reasoning item's encrypted_content


class _Items:
    """Input items -> chat messages."""

    def __init__(self, open_reasoning: Opener | None) -> None:
        self.out: list[dict[str, Any]] = []
        self.reasoning: list[str] = []  # waiting for the next assistant message
        self.open_reasoning = open_reasoning

    def assistant(self, message: dict[str, Any]) -> None:
        if self.reasoning:
            message["reasoning_content"] = "\n".join(self.reasoning)
            self.reasoning = []
        self.out.append(message)

    def call(self, i: int, item: dict[str, Any], name: str, arguments: str) -> None:
        call = {"id": item.get("call_id") or item.get("id") or f"call_{i}",
                "type": "function", "function": {"name": name, "arguments": arguments}}
        last = self.out[-1] if self.out else None
        if last is not None and last["role"] == "assistant" and last.get("tool_calls") \
                is not None and not self.reasoning:
            last["tool_calls"].append(call)
        else:
            self.assistant({"role": "assistant", "content": None, "tool_calls": [call]})

    def output(self, item: dict[str, Any], where: str) -> None:
        output = item.get("output")
        if isinstance(output, list):
            output = content_text(output, f"{where}.output")
        elif not isinstance(output, str):
            output = json.dumps(output, ensure_ascii=False)
        self.out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": output})

    def add(self, i: int, item: Any) -> None:
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise invalid(f"{where}.role", f"unknown role {role!r}")
            content = item.get("content")
            if role != "assistant" and isinstance(content, list) and has_media(content):
                # parts stay parts, each image or audio in its place
                content = [dict(p, _where=f"{where}.content[{j}]") if isinstance(p, dict)
                           else p for j, p in enumerate(content)]
            else:
                content = content_text(content, f"{where}.content")
            message = {"role": role, "content": content}
            if role == "assistant":
                self.assistant(message)
            else:
                self.out.append(message)
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments", "{}")
            if not isinstance(name, str) or not isinstance(args, str):
                raise invalid(where, "function_call items need a 'name' and 'arguments' string")
            self.call(i, item, model_name(name, _namespace(item, where)), args)
        elif kind == "custom_tool_call":
            name, text = item.get("name"), item.get("input", "")
            if not isinstance(name, str) or not isinstance(text, str):
                raise invalid(where, "custom_tool_call items need a 'name' and 'input' string")
            self.call(i, item, model_name(name, _namespace(item, where)),
                      json.dumps({"input": text}, ensure_ascii=False))
        elif kind == "local_shell_call":
            raw_action = item.get("action")
            action: dict[str, Any] = raw_action if isinstance(raw_action, dict) else {}
            args = {"command": action.get("command", [])}
            if action.get("working_directory"):
                args["workdir"] = action["working_directory"]
            if action.get("timeout_ms"):
                args["timeout_ms"] = action["timeout_ms"]
            self.call(i, item, LOCAL_SHELL, json.dumps(args, ensure_ascii=False))
        elif kind in ("function_call_output", "custom_tool_call_output",
                      "local_shell_call_output"):
            self.output(item, where)
        elif kind == "reasoning":
            self.reasoning_item(item, where)
        elif kind not in HOSTED_ITEMS:
            raise invalid(f"{where}.type", f"input item type {kind!r} is not supported")

    def reasoning_item(self, item: dict[str, Any], where: str) -> None:
        texts = [content_text(item.get(key) or [], f"{where}.{key}")
                 for key in ("content",) if item.get(key)]
        if not texts and self.open_reasoning is not None and item.get("encrypted_content"):
            opened = self.open_reasoning(item["encrypted_content"])
            texts = [opened] if opened else []
        if not texts and item.get("summary"):
            texts = [content_text(item["summary"], f"{where}.summary")]
        self.reasoning += [t for t in texts if t]


def _namespace(item: dict[str, Any], where: str) -> str | None:
    ns = item.get("namespace")
    if ns is not None and not isinstance(ns, str):
        raise invalid(f"{where}.namespace", "'namespace' must be a string")
    return ns or None


def input_messages(raw: Any, open_reasoning: Opener | None = None) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise invalid("input", "'input' must be a string or a list of items")
    items = _Items(open_reasoning)
    for i, item in enumerate(raw):
        items.add(i, item)
    return items.out


def _function(tool: dict[str, Any], where: str, namespace: str | None
              ) -> tuple[dict[str, Any], OfferedTool]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}.name", "each tool needs a 'name'")
    kind = tool.get("type")
    # the client's own key order: the template renders this object as JSON, and the
    # same tool sent through chat must give the same prompt
    fn: dict[str, Any] = {k: (model_name(name, namespace) if k == "name" else v)
                          for k, v in tool.items()
                          if k in ("name", "description", "parameters", "strict")}
    description = tool.get("description")
    if kind == "custom":  # one free-text argument
        fn["parameters"], description = custom_parameters(tool.get("format"), description,
                                                          f"{where}.format")
        if isinstance(description, str):
            fn["description"] = description
    return {"type": "function", "function": fn}, OfferedTool(str(kind), name, namespace)


def _tools(raw: Any) -> tuple[list[dict[str, Any]], dict[str, OfferedTool]]:
    if raw is None:
        return [], {}
    if not isinstance(raw, list):
        raise invalid("tools", "'tools' must be a list")
    tools, offered = [], {}

    def add(chat: dict[str, Any], spec: OfferedTool) -> None:
        tools.append(chat)
        offered[chat["function"]["name"]] = spec

    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or not isinstance(kind, str):
            raise invalid(where, "each tool must be an object with a 'type'")
        if kind in ("function", "custom"):
            add(*_function(tool, where, None))
        elif kind == "namespace":
            ns, inner = tool.get("name"), tool.get("tools")
            if not isinstance(ns, str) or not ns or not isinstance(inner, list):
                raise invalid(where, "a namespace needs a 'name' and a list of 'tools'")
            for j, t in enumerate(inner):
                if not isinstance(t, dict) or t.get("type") not in ("function", "custom"):
                    raise invalid(f"{where}.tools[{j}]", "namespace tools must be function "
                                  "or custom tools")
                add(*_function(t, f"{where}.tools[{j}]", ns))
        elif kind == "local_shell":
            add({"type": "function", "function": {
                "name": LOCAL_SHELL, "parameters": LOCAL_SHELL_PARAMETERS,
                "description": "Run a command on the user's machine and get its output"}},
                OfferedTool("local_shell", LOCAL_SHELL))
        elif kind not in HOSTED_TOOLS:
            raise invalid(f"{where}.type", f"unknown tool type {kind!r}")
    return tools, offered


def _tool_choice(raw: Any, offered: dict[str, OfferedTool]) -> Any:
    if not isinstance(raw, dict):
        return raw
    kind = raw.get("type")
    if kind in ("function", "custom"):
        name = model_name(str(raw.get("name")), raw.get("namespace"))
        return {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        return "required" if raw.get("mode") == "required" else "auto"
    if kind == "local_shell" and LOCAL_SHELL in offered:
        return {"type": "function", "function": {"name": LOCAL_SHELL}}
    return "auto"  # a hosted tool this server leaves out


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


def parse_request(body: Body, open_reasoning: Opener | None = None) -> ResponseRequest:
    data = body.data
    if "input" not in data and not data.get("previous_response_id") \
            and not data.get("conversation"):
        raise invalid("input", "'input' is required")
    messages = input_messages(data.get("input", []), open_reasoning)
    instructions = body.string("instructions")
    chat: dict[str, Any] = {}
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"),
                     ("max_output_tokens", "max_tokens"), ("parallel_tool_calls",
                                                           "parallel_tool_calls"),
                     ("seed", "seed"), ("top_k", "top_k"), ("min_p", "min_p"),
                     ("model", "model"), ("lora", "lora"),
                     # llama-server's extensions, as its chat route reads them
                     ("thinking_budget_tokens", "thinking_budget_tokens"),
                     ("reasoning_budget_tokens", "reasoning_budget_tokens"),
                     ("chat_template_kwargs", "chat_template_kwargs"),
                     ("ignore_eos", "ignore_eos")):
        if data.get(src) is not None:
            chat[dst] = data[src]
    tools, offered = _tools(data.get("tools"))
    if tools:
        chat["tools"] = tools
    if data.get("tool_choice") is not None:
        choice = _tool_choice(data["tool_choice"], offered)
        if tools or choice == "none":
            chat["tool_choice"] = choice
    fmt = _format(data.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    reasoning = data.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    include = data.get("include") or []
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise invalid("include", "'include' must be a list of strings")
    metadata = body.obj("metadata") or {}
    previous = body.string("previous_response_id")
    store = body.boolean("store", True)
    echo = {"instructions": instructions, "max_output_tokens": data.get("max_output_tokens"),
            "metadata": metadata, "parallel_tool_calls": data.get("parallel_tool_calls", True),
            "previous_response_id": previous, "store": store,
            "temperature": data.get("temperature"), "top_p": data.get("top_p"),
            "text": data.get("text") or {"format": {"type": "text"}},
            "tool_choice": _echoed_choice(data.get("tool_choice", "auto")),
            "tools": [_echoed_tool(t) for t in data.get("tools") or []],
            "reasoning": reasoning, "truncation": "disabled", "background": False}
    conversation = _conversation_id(data.get("conversation"))
    if conversation is not None and previous is not None:
        raise invalid("conversation", "'conversation' and 'previous_response_id' cannot "
                      "both be given")
    if conversation is not None:
        echo["conversation"] = {"id": conversation}
    return ResponseRequest(messages, instructions, chat, echo, previous, store,
                           body.boolean("generate", True), metadata, offered,
                           frozenset(include), data.get("input"), conversation)


def _echoed_choice(choice: Any) -> Any:
    """``tool_choice`` as the response repeats it. ``{"type": "local_shell"}`` (accepted
    here, not a choice OpenAI lists) is repeated as what the model was given: a forced
    call of the function ``local_shell``."""
    if isinstance(choice, dict) and choice.get("type") == LOCAL_SHELL:
        return {"type": "function", "name": LOCAL_SHELL}
    return choice


def _echoed_tool(tool: Any) -> Any:
    """A tool as the response object repeats it: a function tool with the fields the
    API always sends (``strict`` and ``parameters`` null when the client gave none)."""
    if isinstance(tool, dict) and tool.get("type") == "function":
        return {"strict": None, "parameters": None, "description": None, **tool}
    return tool


def _conversation_id(raw: Any) -> str | None:
    """Responses' ``conversation``: an id, or an object holding one."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        raw = raw.get("id")
    if not isinstance(raw, str) or not raw:
        raise invalid("conversation", "'conversation' must be a conversation id or an "
                      "object with its 'id'")
    return raw
