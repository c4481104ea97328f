"""Conversations adapted to what a chat template can take, as llama.cpp's chat layer does.

A template renders exactly what the client sent wherever it can (so the prompt is
transformers' own). Where it cannot, ``probe`` finds once, on a tool conversation as the
OpenAI SDK sends it (an assistant tool call with ``content: null``, its result in a
``tool`` message), which of these few changes make it render, and ``adapt`` applies them
to every conversation:

- ``empty_content``: ``null`` content becomes ``""`` (Qwen3, QwQ, gpt-oss, Granite, Phi-3.5,
  Mistral's templates index or concatenate it);
- ``text_arguments``: a call's arguments go as JSON text rather than an object (DeepSeek
  R1's distills, Functionary 3.2 concatenate them);
- ``short_ids``: call ids become 9 letters and digits, the same for a call and its result
  (Mistral's templates refuse any other);
- ``tools_as_text``: a template with no tool turns (Gemma 2) gets each call as JSON text in
  the assistant's turn and each result as a user turn ``{"tool_response": ...}``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

Message = Mapping[str, Any]
PROBE_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
PROBE: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_8f2c1a9d", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
         {"role": "tool", "tool_call_id": "call_8f2c1a9d", "content": "Sunny, 21 C"}]


@dataclass(frozen=True)
class Adaptations:
    empty_content: bool = False
    text_arguments: bool = False
    short_ids: bool = False
    tools_as_text: bool = False

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def names(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


def probe(render: Callable[[Sequence[Message], Any], str], error: type[Exception]
          ) -> Adaptations | None:
    """The fewest adaptations with which ``render(messages, tools)`` takes the probe
    conversation (none when it takes it as sent; None when nothing helps)."""
    names = [f.name for f in fields(Adaptations)]
    for n in range(len(names) + 1):
        for chosen in itertools.combinations(names, n):
            adaptations = Adaptations(**dict.fromkeys(chosen, True))
            try:
                render(adapt(PROBE, adaptations), PROBE_TOOLS)
            except error:
                continue
            return adaptations
    return None


def _short_id(call_id: Any) -> str:
    """An id as 9 letters and digits (one that is already is kept)."""
    text = str(call_id)
    if len(text) == 9 and text.isalnum():
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()
    return "".join(c for c in digest if c.isalnum())[:9]


def adapt(messages: Sequence[Message], a: Adaptations) -> list[Message]:
    if not a:
        return list(messages)
    out: list[Message] = []
    results = False  # the last turn out is tool results turned into a user turn
    for original in messages:
        m = dict(original)
        was_result = m.get("role") == "tool"
        if a.empty_content and m.get("content") is None:
            m["content"] = ""
        calls = m.get("tool_calls")
        if calls and (a.text_arguments or a.short_ids or a.tools_as_text):
            m["tool_calls"] = [_call(c, a) for c in calls]
        if a.short_ids and m.get("tool_call_id") is not None:
            m["tool_call_id"] = _short_id(m["tool_call_id"])
        if a.tools_as_text:
            m = _as_text(m)
            if m.get("role") == "user" and out and out[-1].get("role") == "user" and \
                    (was_result or results) and isinstance(m.get("content"), str) and \
                    isinstance(out[-1].get("content"), str):
                # tool results turned user turn beside a user turn: one turn, so the roles
                # still alternate (two user turns the client sent stay two)
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{m['content']}"}
                results = was_result
                continue
            results = was_result
        out.append(m)
    return out


def _call(call: Any, a: Adaptations) -> Any:
    if not isinstance(call, dict):
        return call
    call = dict(call)
    if a.short_ids and "id" in call:
        call["id"] = _short_id(call["id"])
    fn = call.get("function")
    if a.text_arguments and isinstance(fn, dict) and not isinstance(fn.get("arguments"), str):
        call["function"] = {**fn, "arguments": json.dumps(fn.get("arguments", {}),
                                                          ensure_ascii=False)}
    return call


def _as_text(m: dict[str, Any]) -> dict[str, Any]:
    """Tool turns for a template without them: a call as JSON text in the assistant's turn,
    a result as a user turn."""
    calls = m.pop("tool_calls", None)
    if m.get("role") == "assistant" and calls:
        text = json.dumps({"tool_calls": [c.get("function", c) for c in calls]},
                          ensure_ascii=False)
        m["content"] = "\n".join(t for t in (m.get("content") or "", text) if t)
    if m.get("role") == "tool":
        result = json.dumps({"tool_response": {"id": m.get("tool_call_id"),
                                               "content": m.get("content")}},
                            ensure_ascii=False)
        m = {"role": "user", "content": result}
    return m


def with_descriptions(tools: Sequence[Any]) -> list[Any]:
    """Tools whose function and parameters all carry a ``description`` (``""`` where the
    client gave none), for a template that writes them unchecked (Command R+)."""
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            out.append(tool)
            continue
        params = fn.get("parameters")
        if isinstance(params, dict) and isinstance(params.get("properties"), dict):
            props = {k: {"description": "", **v} if isinstance(v, dict) else v
                     for k, v in params["properties"].items()}
            params = {**params, "properties": props}
        out.append({**tool, "function": {"description": "", **fn,
                                         **({"parameters": params} if params else {})}})
    return out
