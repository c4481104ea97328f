"""GBNF for Gemma 4's tool calls: ``<|tool_call>call:NAME{key:value,...}<tool_call|>``
with the arguments typed by the tool's parameter schema in Gemma 4's own value syntax
(``parsers.gemma4``: bare keys, strings between ``<|"|>`` tokens, JSON numbers and words).

The JSON converter cannot write that syntax, so the schema (made ready by
``json_schema.SchemaSet``, as for every grammar) is walked here: objects with their
properties in order (required ones always, optional ones may be left out), strings with
``enum`` / ``const`` / ``minLength`` / ``maxLength`` / anchored ``pattern`` (the converter's
pattern rules, unquoted), arrays with item counts, ``anyOf`` / ``oneOf`` / type lists as
alternatives, local ``$ref`` s (recursion included) as rules; numbers, integers (their
bounds too), booleans and null are the converter's own JSON rules, which Gemma 4 shares.
A schema needing anything else (``allOf``, ``prefixItems`` …) cannot be written: a strict
tool's is a 400, any other tool's arguments become any Gemma 4 object.
"""

from __future__ import annotations

import json
from typing import Any

from engine.constraints.grammar import (
    Grammar,
    GrammarError,
    _after,
    _blocks,
    _converter,
    _gbnf_literal,
    _local,
    _tools_error,
    _trigger,
    _visit,
    bounded,
    checked_parameters,
    custom_rule,
    is_strict,
    raw_pattern,
    strict_strings,
)
from engine.constraints.json_schema import SchemaSet
from engine.constraints.lark_rules import CUSTOM_GRAMMAR
from engine.constraints.schema_converter import counted, distinct, entries, ordered_members
from engine.constraints.schema_terms import DISTINCT, ENTRY_COUNT, KEY_PATTERN

QUOTE = '<|"|>'
_HANDLED = {"type", "properties", "required", "additionalProperties", "items", "minItems",
            "maxItems", "enum", "const", "anyOf", "oneOf", "minLength", "maxLength", "pattern",
            "format", "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
            "multipleOf", "uniqueItems", "minProperties", "maxProperties", "$defs", "$places",
            CUSTOM_GRAMMAR, KEY_PATTERN, ENTRY_COUNT, DISTINCT}
_BASE = {
    "g4-char": '[^<] | "<" [^|]',  # a string cannot hold the start of a control token
    "g4-string": f'{_gbnf_literal(QUOTE)} g4-char* {_gbnf_literal(QUOTE)}',
    "g4-number": '"-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]{1,21})? ([eE] [-+]? [0-9]{1,3})?',
    "g4-key": "[A-Za-z_] [A-Za-z0-9_]{0,63}",
    "g4-object": '"{" (g4-key ":" g4-value ("," g4-key ":" g4-value)*)? "}"',
    "g4-array": '"[" (g4-value ("," g4-value)*)? "]"',
    "g4-value": 'g4-string | g4-number | "true" | "false" | "null" | g4-object | g4-array',
}


def literal(value: Any) -> str:
    """``value`` written as Gemma 4 writes it, as a GBNF literal."""
    return _gbnf_literal(_text(value))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_text(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return json.dumps(value)


class _Values:
    """One grammar's Gemma 4 value rules, from schemas localized in ``schemas``."""

    def __init__(self, conv: Any, schemas: SchemaSet) -> None:
        self.conv, self.schemas = conv, schemas
        self.defs: dict[str, str] = {}
        for name, body in _BASE.items():
            conv._add_rule(name, body)

    def rule(self, schema: Any, name: str) -> str:
        """A GBNF expression for the values of ``schema``."""
        if schema is True or schema == {}:
            return "g4-value"
        if not isinstance(schema, dict):
            raise GrammarError(f"cannot build a Gemma 4 call grammar for {schema!r}")
        unknown = sorted(set(schema) - _HANDLED)
        if unknown:
            raise GrammarError(f"cannot build a Gemma 4 call grammar for {', '.join(unknown)}")
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        if "const" in schema:
            return literal(schema["const"])
        if "enum" in schema:
            return "(" + " | ".join(literal(v) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                return self._add(name, " | ".join(
                    self.rule({**rest, **sub} if isinstance(sub, dict) else sub, f"{name}-{i}")
                    for i, sub in enumerate(schema[key])))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self._add(name, " | ".join(
                self.rule({**schema, "type": k}, f"{name}-{k}") for k in kind))
        if kind == "string":
            return self._string(schema, name)
        if kind == "object" or "properties" in schema:
            return self._object(schema, name)
        if kind == "array":
            return self._array(schema, name)
        if kind in ("integer", "number", "boolean", "null"):
            return _visit(self.conv, self.schemas.root(schema), name)  # JSON's own rules
        return "g4-value"

    def _add(self, name: str, body: str) -> str:
        return str(self.conv._add_rule(name, body))

    def _ref(self, ref: str) -> str:
        key = ref.rsplit("/", 1)[-1]
        if key not in self.defs:
            name = self.defs[key] = f"g4-def-{len(self.defs)}"
            self.conv._add_rule(name, "g4-value")  # a placeholder while it is being built
            target = self.schemas.defs.get(key)
            if target is None:
                raise GrammarError(f"cannot resolve {ref}")
            self.conv._rules[name] = self.rule(target, f"{name}-body")
        return self.defs[key]

    def _string(self, schema: dict[str, Any], name: str) -> str:
        quote = _gbnf_literal(QUOTE)
        if isinstance(schema.get(CUSTOM_GRAMMAR), dict):
            inner = custom_rule(self.conv, schema[CUSTOM_GRAMMAR], name, json_mode=False)
            return self._add(name, f"{quote} {inner} {quote}")
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$"):
            inner = raw_pattern(self.conv, pattern, name)
            return self._add(name, f"{quote} {inner} {quote}")
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        if lo or hi is not None:
            return self._add(name, f"{quote} {counted('g4-char', lo, hi)} {quote}")
        return "g4-string"

    def _object(self, schema: dict[str, Any], name: str) -> str:
        props: dict[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties", True)
        low, high = schema.get(ENTRY_COUNT) or (0, None)
        if not props and (extra is False or KEY_PATTERN in schema):
            if low:  # (a map's keys are JSON strings: Gemma 4 writes none)
                raise GrammarError("cannot build a Gemma 4 call grammar for a map's keys")
            return '"{" "}"'  # no key allowed, or a map's: none (a subset)
        if not props and isinstance(extra, dict):  # a map: keys of any name, values of its schema
            entry = self._add(f"{name}-entry", f'g4-key ":" {self.rule(extra, f"{name}-value")}')
            more = self._add(f"{name}-more", f'"," {entry}')
            return self._add(name, f'"{{" {entries(entry, more, low, high)} "}}"')
        if not props:
            return "g4-object"
        required = set(schema.get("required", []))
        pairs = [(f"{name}-{i}", f'{_gbnf_literal(key + ":")} '
                                 f'{self.rule(sub, f"{name}-{i}")}', key in required)
                 for i, (key, sub) in enumerate(props.items())]
        first = ordered_members(pairs, self._add, '","')  # the schema's order, as in JSON
        return self._add(name, f'"{{" {first} "}}"')

    def _array(self, schema: dict[str, Any], name: str) -> str:
        if DISTINCT in schema:  # distinct listed values, in the order listed
            values, low = schema[DISTINCT]
            body = distinct([literal(v) for v in values], low, self._add, f"{name}-distinct",
                            '","')
            return self._add(name, f'"[" {body} "]"')
        item = self.rule(schema.get("items", True), f"{name}-item")
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        if hi == 0:
            return self._add(name, '"[" "]"')
        more = f"{{{max(lo - 1, 0)},{hi - 1}}}" if hi is not None else \
            f"{{{max(lo - 1, 0)},}}"
        body = f'{item} ("," {item}){more}'
        return self._add(name, f'"[" {body} "]"' if lo else f'"[" ({body})? "]"')


def gemma4_call_grammar(tools: list[dict[str, Any]], start: str, end: str, *,
                        parallel: bool, lazy: bool, after: str | None = None) -> Grammar:
    """Blocks of ``start`` ``call:NAME{...}`` ``end`` for one of ``tools``; ``parallel``,
    ``lazy`` and ``after`` as for ``engine.constraints.grammar.tool_call_grammar``."""
    try:
        return _grammar(tools, start, end, parallel=parallel, lazy=lazy, after=after)
    except GrammarError as exc:
        raise _tools_error(exc) from None


FREE_TEXT = '([^<|] | "<" [^|] | "|" [^>])*'  # an answer: text without Gemma 4's markup


def gemma4_answer_grammar(tools: list[dict[str, Any]], start: str, end: str, *,
                          parallel: bool, after: str | None) -> Grammar:
    """A free answer (``tool_choice`` auto or none) after the reasoning's end ``after``
    (lazy on it; None: from the first token): text that holds none of Gemma 4's control
    markup (``<|…`` / ``…|>``, so no stray ``<channel|>`` reaches the content), then, with
    ``tools``, calls to them as ``gemma4_call_grammar`` writes them."""
    try:
        conv, schemas = _converter(), SchemaSet()
        values = _Values(conv, schemas)
        conv._add_rule("free-text", FREE_TEXT)
        body = "free-text"
        if tools:
            _call_block(conv, values, schemas, tools, start, end)
            body += ' ("\n"? call-block)*' if parallel else ' ("\n"? call-block)?'
    except GrammarError as exc:
        raise _tools_error(exc) from None
    conv._add_rule("root", body if after is None else _after(after, f"({body})"))
    return Grammar(bounded(strict_strings(str(conv.format_grammar()))),
                   () if after is None else (_trigger(after),), tuple(schemas.relaxed))


def _arguments(values: _Values, schemas: SchemaSet, tool: dict[str, Any], i: int) -> str:
    fn = tool["function"]
    params = checked_parameters(tool, lambda conv, probe, local:
                                _Values(conv, probe).rule(local, "probe"))
    return values.rule(_local(schemas, params, f"tools.{fn['name']}.parameters",
                              is_strict(tool)), f"fn{i}-args")


def _call_block(conv: Any, values: _Values, schemas: SchemaSet, tools: list[dict[str, Any]],
                start: str, end: str) -> None:
    calls = []
    for i, tool in enumerate(tools):
        args = _arguments(values, schemas, tool, i)
        head = _gbnf_literal("call:" + tool["function"]["name"])
        calls.append(conv._add_rule(f"fn{i}", f"{head} {args}"))
    conv._add_rule("call-block", f"{_gbnf_literal(start)} ({' | '.join(calls)}) "
                                 f"{_gbnf_literal(end)}")


def _grammar(tools: list[dict[str, Any]], start: str, end: str, *, parallel: bool,
             lazy: bool, after: str | None) -> Grammar:
    conv, schemas = _converter(), SchemaSet()
    _call_block(conv, _Values(conv, schemas), schemas, tools, start, end)
    return _blocks(conv, schemas, parallel=parallel, lazy=lazy, start=start, after=after)
