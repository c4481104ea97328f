"""GBNF grammars that guarantee structured output and tool calls.

JSON Schema -> GBNF goes through llama-cpp-python's converter (pure Python,
``llama_cpp.llama_grammar.SchemaConverter``); this module only wraps its rules:
a JSON value for ``response_format``, or tool-call blocks in the model family's
own markup (``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` for
Hermes-style families) for ``tool_choice`` ``required`` / a named function, and
the same rules behind a lazy trigger (the call marker) for ``auto``; or XML-style
blocks (``<function=NAME>`` / ``<parameter=KEY>`` as in Qwen3.5) whose parameter
values are typed by the tool's schema.
Conversion costs milliseconds, so callers run it off the event loop.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import llama_cpp.llama_grammar

_G: Any = llama_cpp.llama_grammar  # untyped Python module: used through Any


class GrammarError(ValueError):
    """A schema the converter cannot turn into a grammar (a 400 for the request)."""


@dataclass(frozen=True)
class Grammar:
    text: str
    lazy_patterns: tuple[str, ...] = ()  # empty: constrain from the first token


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)  # GBNF string literals use JSON escapes


def _converter() -> Any:
    return _G.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _visit(conv: Any, schema: Any, name: str) -> str:
    try:
        resolved = conv.resolve_refs(schema, "request")
        return str(conv.visit(resolved, name))
    except (KeyError, ValueError, TypeError, RecursionError, AssertionError) as exc:
        raise GrammarError(f"cannot build a grammar for this JSON schema: {exc}") from None


def json_grammar(schema: dict[str, Any] | None, after: str | None = None) -> Grammar:
    """Any JSON object (``schema`` None) or a value of ``schema``. With ``after`` (the end
    of a reasoning block), the model reasons freely and the JSON follows that marker."""
    conv = _converter()
    value = _visit(conv, schema if schema is not None else {"type": "object"}, "json-value")
    if after is None:
        conv._add_rule("root", value)
        return Grammar(str(conv.format_grammar()))
    conv._add_rule("root", f'{_gbnf_literal(after)} [ \\t\\n]* {value}')
    return Grammar(str(conv.format_grammar()), (_trigger(after),))


def _trigger(marker: str) -> str:
    """A lazy-grammar pattern: llama.cpp matches it against everything generated so far
    and constrains from its first group on."""
    return r"[\s\S]*?(" + re.escape(marker) + r"[\s\S]*)"


def tool_call_grammar(tools: list[dict[str, Any]], start: str, end: str, *,
                      parallel: bool, lazy: bool) -> Grammar:
    """Blocks of ``start\\n{"name": <one of tools>, "arguments": <its parameters>}\\nend``;
    ``parallel`` allows several, separated by newlines."""
    calls = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object"}
        calls.append({"type": "object", "properties": {
            "name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"]})
    conv = _converter()
    call = _visit(conv, calls[0] if len(calls) == 1 else {"anyOf": calls}, "call")
    conv._add_rule("call-block", f'{_gbnf_literal(start + chr(10))} {call} '
                                 f'{_gbnf_literal(chr(10) + end)}')
    conv._add_rule("root", '"\\n"? call-block ("\\n" call-block)*' if parallel
                   else '"\\n"? call-block')
    return Grammar(str(conv.format_grammar()), (_trigger(start),) if lazy else ())


def xml_tool_call_grammar(tools: list[dict[str, Any]], start: str, end: str, *,
                          parallel: bool, lazy: bool) -> Grammar:
    """Blocks of ``start\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*
    </function>\nend``: required parameters in order, optional ones may be left out;
    string values are free text that cannot hold a newline followed by ``<``."""
    conv = _converter()
    conv._add_rule("xml-text", '([^\\n] | "\\n" [^<])*')
    alternatives = []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        params = fn.get("parameters") or {}
        required = set(params.get("required", []))
        parts = []
        for j, (key, spec) in enumerate((params.get("properties") or {}).items()):
            kind = spec.get("type") if isinstance(spec, dict) else None
            value = "xml-text" if kind in (None, "string") else _visit(
                conv, {"type": kind} if isinstance(kind, str) else spec, f"fn{i}-p{j}-value")
            rule = conv._add_rule(f"fn{i}-p{j}", f'{_gbnf_literal(f"<parameter={key}>" + chr(10))} '
                                  f'{value} {_gbnf_literal(chr(10) + "</parameter>" + chr(10))}')
            parts.append(rule if key in required else f"{rule}?")
        head = _gbnf_literal(f"<function={fn['name']}>" + chr(10))
        alternatives.append(conv._add_rule(f"fn{i}", " ".join(
            [head, *parts, _gbnf_literal("</function>")])))
    conv._add_rule("call", " | ".join(alternatives))
    conv._add_rule("call-block", f'{_gbnf_literal(start + chr(10))} call '
                                 f'{_gbnf_literal(chr(10) + end)}')
    conv._add_rule("root", '"\\n"? call-block ("\\n" call-block)*' if parallel
                   else '"\\n"? call-block')
    return Grammar(str(conv.format_grammar()), (_trigger(start),) if lazy else ())
