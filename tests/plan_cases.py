"""The thinking / tools / structured-output cases of issue 34 for one template family, and
what makes an answer to each valid: shared by tests/test_family_plans.py (a few seeds
each, in CI) and bench/thinking_tools.py (100 seeds each, against llama-server too).

An answer is an OpenAI chat message (``content``, ``reasoning_content``, ``tool_calls``)
with its ``finish_reason``; ``problem`` says what is wrong with it (None: valid).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
    "days": {"type": "integer"},
    "note": {"type": "string", "maxLength": 6}}, "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"zone": {"const": "UTC"}}, "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time.",
                                           "parameters": TIME}}]
ANSWER = {"type": "object", "properties": {
    "answer": {"type": "string", "maxLength": 12},
    "level": {"enum": ["low", "high"]}}, "required": ["answer", "level"],
    "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
BUDGET = 12
MAX_TOKENS = 200
ON = {"chat_template_kwargs": {"enable_thinking": True}}
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
# each family's control markup: none of it may reach the content or a call's arguments
MARKUP = {"harmony": ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
                      "<|return|>", "<|call|>"),
          "gemma4": ("<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>",
                     "<tool_call|>", '<|"|>', "<|tool_response>"),
          "qwen35": ("<think>", "</think>", "<tool_call>", "</tool_call>", "<function=",
                     "<parameter=", "<|im_end|>"),
          "hermes": ("<tool_call>", "</tool_call>", "<|im_end|>")}
THINKS = {"harmony", "gemma4", "qwen35"}  # Qwen2.5's template has no reasoning block


@dataclass(frozen=True)
class Case:
    name: str
    body: dict[str, Any]  # added to the chat completion request
    expect: str  # "call", "named", "auto", "none", "json"
    thinking: bool  # reasoning expected in reasoning_content (else none)
    max_tokens: int = MAX_TOKENS


NAMED = {"type": "function", "function": {"name": "get_time"}}
ONE = {"tools": TOOLS, "parallel_tool_calls": False}  # a random model never stops calling
CASES = [
    Case("required, budget", {**ONE, "tool_choice": "required", **ON,
                              "thinking_budget_tokens": BUDGET}, "call", True),
    Case("named, budget", {**ONE, "tool_choice": NAMED, **ON,
                           "thinking_budget_tokens": BUDGET}, "named", True),
    Case("auto, budget", {**ONE, "tool_choice": "auto", **ON,
                          "thinking_budget_tokens": BUDGET}, "auto", True, 120),
    Case("none, budget", {**ONE, "tool_choice": "none", **ON,
                          "thinking_budget_tokens": BUDGET}, "none", True, 40),
    Case("json_schema, budget", {"response_format": FORMAT, **ON,
                                 "reasoning_budget_tokens": BUDGET}, "json", True),
    Case("required, thinking off", {**ONE, "tool_choice": "required", **OFF}, "call",
         False),
    Case("json_schema, thinking off", {"response_format": FORMAT, **OFF}, "json", False),
    # no budget anywhere: a constrained answer's thinking gets half of max_tokens
    Case("required, no budget", {**ONE, "tool_choice": "required", **ON}, "call", True,
         240),
]


def family_cases(family: str) -> list[Case]:
    """The cases a family's template can take (one without thinking: those without)."""
    return [c for c in CASES if family in THINKS or not c.thinking]


def request(case: Case, seed: int, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Weather?"}],
            "max_tokens": case.max_tokens, "seed": seed, "temperature": 1.0, "stream": stream,
            **case.body}


def problem(family: str, case: Case, message: dict[str, Any], finish: str | None
            ) -> str | None:
    """What is wrong with this answer to ``case`` (None: it is valid)."""
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or ""
    calls = message.get("tool_calls") or []
    for marker in MARKUP[family]:
        if marker in content:
            return f"markup {marker!r} in the content"
    if case.thinking and not reasoning:
        return "no reasoning_content"
    if not case.thinking and reasoning:
        return "reasoning with thinking off"
    if case.expect in ("call", "named") or (case.expect == "auto" and calls):
        if finish != "tool_calls" or not calls:
            return f"no call (finish {finish})"
        for call in calls:
            fn = call["function"]
            if case.expect == "named" and fn["name"] != "get_time":
                return f"called {fn['name']!r}, not the named tool"
            schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
            if fn["name"] not in schema:
                return f"unknown tool {fn['name']!r}"
            try:
                jsonschema.validate(json.loads(fn["arguments"]), schema[fn["name"]])
            except (ValueError, jsonschema.ValidationError) as exc:
                return f"arguments {fn['arguments']!r}: {str(exc)[:80]}"
        return None
    if calls:
        return "a call where none was allowed"
    if case.expect == "json":
        if finish != "stop":
            return f"finish {finish}"
        try:
            jsonschema.validate(json.loads(content), ANSWER)
        except (ValueError, jsonschema.ValidationError) as exc:
            return f"content {content[:60]!r}: {str(exc)[:80]}"
    return None


def read_stream(lines: Any) -> tuple[dict[str, Any], str | None]:
    """An SSE chat completion's message and finish reason, from its ``data:`` lines."""
    content, reasoning, finish = "", "", None
    calls: dict[int, dict[str, Any]] = {}
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for c in delta.get("tool_calls") or []:
                entry = calls.setdefault(c["index"], {"function": {"name": "", "arguments": ""}})
                fn = c.get("function") or {}
                entry["function"]["name"] += fn.get("name") or ""
                entry["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return {"content": content, "reasoning_content": reasoning,
            "tool_calls": [calls[i] for i in sorted(calls)]}, finish
