"""Maps (``engine.constraints.schema_keywords._map_keys``): an object with no declared
property, ``additionalProperties: false`` and ``patternProperties`` (218 of MaskBench's
strict refusals: ``{"patternProperties": {"^[a-z]+$": {...}}, "additionalProperties":
false}``) is written as any number of keys matching the patterns, each value under their
schema, in JSON, XML call parameters and Gemma 4 calls alike; a key the patterns refuse
is refused by llama.cpp's grammar sampler, and every random walk validates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from grammar_walk import GrammarWalker, TextChecker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.chat.answer_check import schema_errors
from conftest import require_model
from engine.constraints.grammar import json_grammar, xml_tool_call_grammar
from engine.constraints.grammar_gemma4 import gemma4_call_grammar
from engine.constraints.schema_terms import KEY_PATTERN

KEYS = ["^[a-z]{1,4}$", "[A-Z]", "^\\d*$", "^x_", "^(foo|bar)$", "id$"]
VALUES: list[Any] = [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string",
                     "maxLength": 3}, True, {"type": "array", "items": {"type": "boolean"},
                                             "maxItems": 2}]


@pytest.fixture(scope="module")
def walker() -> Iterator[GrammarWalker]:
    w = GrammarWalker(require_model("qwen-0.5b"))
    yield w
    w.close()


@pytest.fixture(scope="module")
def checker() -> Iterator[TextChecker]:
    c = TextChecker(require_model("qwen-0.5b"))
    yield c
    c.close()


@pytest.mark.model
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True),
       value=st.sampled_from(VALUES), nested=st.booleans(), seed=st.integers(0, 1 << 20))
def test_a_maps_keys_match_its_patterns(walker: GrammarWalker, keys: list[str], value: Any,
                                        nested: bool, seed: int) -> None:
    m = {"type": "object", "additionalProperties": False,
         "patternProperties": {k: value for k in keys}}
    schema = {"type": "object", "properties": {"m": m}, "required": ["m"],
              "additionalProperties": False} if nested else m
    grammar = json_grammar(schema, strict=True)
    assert not grammar.relaxed
    for i in range(6):
        text = walker.walk(grammar.text, np.random.default_rng(seed + i))
        if text is None:
            continue
        parsed = json.loads(text)
        assert schema_errors(parsed, schema) is None, (schema, text)


@pytest.mark.model
def test_keys_the_patterns_refuse_are_refused(checker: TextChecker) -> None:
    schema = {"type": "object", "additionalProperties": False,
              "patternProperties": {"^[a-z]+$": {"type": "integer"}}}
    g = json_grammar(schema, strict=True).text
    for ok in ('{}', '{"ab": 1}', '{"a": 1, "zz": 20}'):
        assert checker.accepts(g, ok), ok
    for bad in ('{"A": 1}', '{"1": 1}', '{"": 1}', '{"ab": "x"}', '{"a b": 1}'):
        assert not checker.accepts(g, bad), bad


@pytest.mark.model
def test_a_key_pattern_sent_in_a_schema_is_not_read(checker: TextChecker) -> None:
    """The walker's own marker (``KEY_PATTERN``) in a request's schema is left out: the
    validator allows this object nothing, so neither does the grammar."""
    schema = {"type": "object", "additionalProperties": False, KEY_PATTERN: "^[a-z]+$"}
    g = json_grammar(schema, strict=True).text
    assert checker.accepts(g, "{}") and not checker.accepts(g, '{"ab": 1}')


def _tool(params: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "strict": strict,
                                             "parameters": params}}


@pytest.mark.model
def test_call_markup_writes_no_key_a_strict_schema_refuses(checker: TextChecker) -> None:
    """XML parameters and Gemma 4 arguments: an object with no declared property whose
    other keys have a schema (or a pattern) wrote any key with any value (text), a strict
    breach; now none under strict (a subset), any without it, as before. Gemma 4 writes a
    map of ``additionalProperties`` values, and no key where none or only a pattern's may
    stand."""
    typed = {"type": "object", "additionalProperties": {"type": "integer"}}
    param = "<tool_call>\n<function=f>\n<parameter=x>\nabc\n</parameter>\n</function>\n" \
            "</tool_call>"
    strict = xml_tool_call_grammar([_tool(typed)], "<tool_call>", "</tool_call>",
                                   parallel=False, lazy=False).text
    assert not checker.accepts(strict, param)
    assert checker.accepts(strict, "<tool_call>\n<function=f>\n</function>\n</tool_call>")
    loose = xml_tool_call_grammar([_tool(typed, strict=False)], "<tool_call>", "</tool_call>",
                                  parallel=False, lazy=False).text
    assert checker.accepts(loose, param)

    q = '<|"|>'
    g = gemma4_call_grammar([_tool({"type": "object", "properties": {
        "m": typed, "p": {"type": "object", "additionalProperties": False,
                          "patternProperties": {"^[a-z]+$": {"type": "integer"}}},
        "c": {"type": "object", "additionalProperties": False}},
        "required": ["m", "p", "c"]})], "<|tool_call>", "<tool_call|>", parallel=False,
        lazy=False).text

    def call(args: str) -> str:
        return "<|tool_call>call:f{" + args + "}<tool_call|>"

    assert checker.accepts(g, call("m:{a:1,b:2},p:{},c:{}"))
    for bad in (f"m:{{a:{q}x{q}}},p:{{}},c:{{}}", "m:{},p:{a:1},c:{}", "m:{},p:{},c:{a:1}"):
        assert not checker.accepts(g, call(bad)), bad
