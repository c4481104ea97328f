"""``strict`` means guaranteed: for every schema drawn, a strict grammar is either refused
with a 400-worthy ``GrammarError`` naming the keyword, or every text it lets a random
model finish validates against the schema (``jsonschema``, formats checked). Without
``strict``, whatever fails is explained by a relaxation the schema set recorded.

Random models are random walks through llama.cpp's own grammar sampler
(``tests/grammar_walk.py``) on Qwen2.5's vocabulary: many seeds per schema, in seconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from grammar_walk import GrammarWalker
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from api.chat.answer_check import schema_errors
from conftest import require_model
from engine.constraints.grammar import (
    GrammarError,
    json_grammar,
    tool_call_grammar,
    xml_tool_call_grammar,
)
from engine.constraints.grammar_shapes import shaped_call_grammar
from engine.constraints.json_schema import SchemaSet
from parsers.call_items import markup_values
from parsers.families import by_name
from parsers.message_stream import MessageStream
from parsers.response_schema import stream_layout

SEEDS = 6
# a failing schema is reported as drawn: shrinking one through grammar walks takes minutes
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


@pytest.fixture(scope="module")
def walker() -> Iterator[GrammarWalker]:
    w = GrammarWalker(require_model("qwen-0.5b"))
    yield w
    w.close()


def _answers(walker: GrammarWalker, grammar: str, seeds: int, seed0: int = 0) -> list[str]:
    texts = [walker.walk(grammar, np.random.default_rng(seed0 + i)) for i in range(seeds)]
    return [t for t in texts if t is not None]


# the nine one-keyword schemas of the issue (a random model breaks each without them)
NINE: dict[str, dict[str, Any]] = {
    "integer bounds": {"type": "object", "properties": {
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "score": {"type": "integer", "minimum": 0, "maximum": 10}},
        "required": ["days", "score"], "additionalProperties": False},
    "exclusive number bounds": {"type": "object", "properties": {
        "p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
        "required": ["p"], "additionalProperties": False},
    "multipleOf": {"type": "object", "properties": {
        "price": {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 100},
        "n": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}},
        "required": ["price", "n"], "additionalProperties": False},
    "not": {"type": "object", "properties": {"v": {"not": {"type": ["string", "null"]}}},
            "required": ["v"], "additionalProperties": False},
    "patternProperties": {"type": "object", "properties": {
        "x_a": {"type": "string"}, "b": {"type": "integer"}},
        "patternProperties": {"^x_": {"type": "string", "maxLength": 3}},
        "required": ["x_a", "b"], "additionalProperties": False},
    "dependentRequired": {"type": "object", "properties": {
        "card": {"type": "string"}, "address": {"type": "string"}},
        "dependentRequired": {"card": ["address"]}, "additionalProperties": False},
    "if then": {"type": "object", "properties": {"kind": {"enum": ["a", "b"]},
                                                 "n": {"type": "integer"}},
                "if": {"properties": {"kind": {"const": "a"}}},
                "then": {"properties": {"n": {"minimum": 5}}}, "required": ["kind", "n"]},
    "uniqueItems": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                               "maximum": 3}, "uniqueItems": True},
    "minProperties": {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string"}}, "minProperties": 1,
        "additionalProperties": False},
}


@pytest.mark.model
@pytest.mark.parametrize("name", list(NINE))
def test_the_nine_keywords_are_enforced_or_refused(walker: GrammarWalker, name: str) -> None:
    schema = NINE[name]
    try:
        grammar = json_grammar(schema, strict=True)
    except GrammarError as exc:
        # refused, naming the keyword and where it stands
        keyword = {"if then": "if", "uniqueItems": "uniqueItems"}.get(name, name)
        assert keyword in str(exc) and "strict" in str(exc), str(exc)
        assert name in ("if then", "uniqueItems"), f"{name} should be enforced: {exc}"
        return
    answers = _answers(walker, grammar.text, 12)
    assert len(answers) >= 8, f"{name}: only {len(answers)} of 12 walks ended"
    for text in answers:
        value = json.loads(text)
        assert schema_errors(value, schema) is None, (name, text, schema_errors(value, schema))


def test_strict_refusals_name_the_keyword_and_its_path() -> None:
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                  "uniqueItems": True}},
        "required": ["tags"]}}}
    with pytest.raises(GrammarError) as err:
        tool_call_grammar([tool], "<tool_call>", "</tool_call>", parallel=False, lazy=False)
    assert "'f'" in str(err.value) and "parameters.properties.tags.uniqueItems" in str(err.value)
    assert err.value.tools
    # the same tool without strict: a grammar, the relaxation recorded
    loose = {"type": "function", "function": {**tool["function"], "strict": False}}
    assert tool_call_grammar([loose], "<tool_call>", "</tool_call>", parallel=False,
                             lazy=False).relaxed
    schemas = SchemaSet()
    schemas.add({"type": "string", "minLength": 5000}, "schema")
    with pytest.raises(Exception, match=r"schema\.minLength.*strict"):
        SchemaSet().add({"type": "string", "minLength": 5000}, "schema", strict=True)
    SchemaSet().add({"type": "string", "maxLength": 524288}, "schema", strict=True)  # kept


# -- random schemas ---------------------------------------------------------------------
PATTERNS = ["^[a-z]{2,5}$", "^\\d{3}-\\d{4}$", "[A-Z]", "^(foo|bar)+$", "^.{1,4}$",
            "^[^@\\s]+@[a-z]+\\.com$", "x", "^[\\w.-]{1,8}$", "^a?b*c$", "^(?:ab|cd)\\.$",
            "^[^q]{1,12}$", "^\\S{1,12}$"]
FORMATS = ["date", "time", "date-time", "email", "ipv4", "ipv6", "uuid", "hostname", "uri",
           "duration", "regex", "color"]


def _numbers() -> Any:
    ints = st.integers(-50, 120)
    nums = st.one_of(ints, st.decimals(-20, 20, places=2).map(float))
    # no type at all too: bounds alone make a number
    return st.fixed_dictionaries({"type": st.sampled_from(["integer", "number", None])},
                                 optional={
        "minimum": nums, "maximum": nums, "exclusiveMinimum": nums, "exclusiveMaximum": nums,
        "multipleOf": st.sampled_from([1, 2, 5, 0.5, 0.1, 0.01, 3])}).map(
        lambda s: {k: v for k, v in s.items() if v is not None})


def _strings() -> Any:
    return st.fixed_dictionaries({"type": st.just("string")}, optional={
        "pattern": st.sampled_from(PATTERNS), "format": st.sampled_from(FORMATS),
        "minLength": st.integers(0, 4), "maxLength": st.integers(0, 8),
        # (and values JSON escapes, or that hold a call markup's value close)
        "enum": st.lists(st.sampled_from(["a", "bb", "ccc", "2024-01-05", "x@y.com", 'a"b',
                                          "c\\d", "x\ny", "café", "a<b", "</parameter>"]),
                         min_size=1, max_size=4, unique=True)})


def _scalar_lists() -> Any:
    """Type lists of scalars beside keywords of each type, and listed values that read as
    another type ("5", "true", "null"): a string is a string, whatever it spells."""
    kinds = st.lists(st.sampled_from(["integer", "number", "string", "boolean", "null"]),
                     min_size=2, max_size=3, unique=True)
    mixed = st.lists(st.sampled_from(["5", 5, "true", True, "null", None, "x", 1.5]),
                     min_size=1, max_size=4, unique_by=json.dumps)
    return st.fixed_dictionaries({"type": kinds}, optional={
        "minimum": st.integers(-5, 20), "maximum": st.integers(-5, 20),
        "maxLength": st.integers(0, 4), "enum": mixed})


def _leaves() -> Any:
    return st.one_of(_numbers(), _strings(), _scalar_lists(), st.just({"type": "boolean"}),
                     st.just({"type": "null"}), st.just({}),
                     st.fixed_dictionaries({"const": st.sampled_from([1, "k", None, True,
                                                                      'q"\\'])}))


def _containers(inner: Any) -> Any:
    names = st.sampled_from(["a", "b", "c", "x_1", "x_2", "id"])
    props = st.dictionaries(names, inner, max_size=4)
    obj = st.fixed_dictionaries({"type": st.just("object"), "properties": props}, optional={
        "additionalProperties": st.one_of(st.booleans(), inner),
        "required": st.lists(names, max_size=3, unique=True),
        "patternProperties": st.dictionaries(st.sampled_from(["^x_", "b"]), inner, max_size=1),
        "minProperties": st.integers(0, 3), "maxProperties": st.integers(0, 4),
        "dependentRequired": st.dictionaries(names, st.lists(names, max_size=2), max_size=2),
        "dependencies": st.dictionaries(names, st.one_of(
            st.lists(names, max_size=2), st.just(True),
            st.fixed_dictionaries({"required": st.lists(names, max_size=2)})), max_size=2),
        "propertyNames": st.just({"maxLength": 2}),
        "if": st.just({"required": ["a"]}), "then": st.just({"required": ["b"]}),
        "not": st.sampled_from([{"required": ["a"]}, {"required": ["a", "b"]}, {}, False])})
    bare_required = st.fixed_dictionaries({"type": st.just("object"),
                                           "required": st.lists(names, min_size=1, max_size=2,
                                                                unique=True)})
    # maps: no declared property, counts of entries (schema_keywords._entries)
    maps = st.fixed_dictionaries({"type": st.just("object")}, optional={
        "additionalProperties": st.one_of(st.booleans(), inner),
        "patternProperties": st.dictionaries(st.sampled_from(["^x_", "b"]), inner, max_size=1),
        "minProperties": st.integers(0, 2), "maxProperties": st.integers(0, 3),
        "propertyNames": st.sampled_from([{"pattern": "^x"}, {"enum": ["a", "x_1"]},
                                          {"type": "string"}, {"maxLength": 2}])})
    arr = st.fixed_dictionaries({"type": st.just("array")}, optional={
        "items": inner, "minItems": st.integers(0, 3), "maxItems": st.integers(0, 4),
        "uniqueItems": st.booleans(), "prefixItems": st.lists(inner, min_size=1, max_size=2),
        "contains": inner})
    unions = st.one_of(
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}, optional={
            "type": st.sampled_from(["object", "integer", "string"])}),
        st.fixed_dictionaries({"oneOf": st.lists(inner, min_size=1, max_size=3)}),
        # one of several required names beside the properties (a value with two matches both)
        st.fixed_dictionaries({"type": st.just("object"), "properties": props, "oneOf": st.lists(
            st.fixed_dictionaries({"required": st.lists(names, min_size=1, max_size=2,
                                                         unique=True)}), min_size=2, max_size=3)},
            optional={"additionalProperties": st.just(False),
                      "required": st.lists(names, max_size=1)}),
        # listed values beside keywords no grammar holds: each value checked
        st.fixed_dictionaries({"enum": st.lists(st.sampled_from(
            [1, 1.0, 2.5, "a", None, [1, 1], [2], {"a": 1}, {}]), min_size=1, max_size=4)},
            optional={"not": st.sampled_from([{"const": 1}, {"type": "string"}]),
                      "uniqueItems": st.just(True), "minProperties": st.just(1),
                      "contains": inner}),
        st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"not": st.sampled_from([{"type": "null"}, {"type": "string"},
                                                       {"const": 3}])}, optional={
            "type": st.sampled_from([["integer", "null", "string"], "number"])}),
        st.fixed_dictionaries({"type": st.sampled_from([["integer", "null"],
                                                        ["string", "null"], ["number", "null"],
                                                        ["number", "string"],
                                                        ["array", "string"]])}, optional={
            "minimum": st.integers(0, 5), "maxLength": st.integers(1, 3),
            "minItems": st.integers(0, 2), "maxItems": st.integers(0, 2),
            "items": st.just(False),
            "multipleOf": st.sampled_from([1, 1.0, 0.5, 0.01, 3])}))
    return st.one_of(obj, bare_required, maps, arr, unions)


def schemas() -> Any:
    return st.recursive(_leaves(), _containers, max_leaves=8)


STATS = {"strict": [0, 0, 0], "loose": [0, 0]}  # built, refused, answers / failures explained


@pytest.mark.model
def test_every_strict_answer_of_any_schema_validates(walker: GrammarWalker) -> None:
    examples = int(os.environ.get("STRICT_FUZZ", "60"))

    @settings(max_examples=examples, deadline=None, derandomize="STRICT_FUZZ" not in os.environ,
              suppress_health_check=list(HealthCheck), phases=NO_SHRINK)
    @given(schemas(), st.integers(0, 1 << 20))
    def check(schema: Any, seed0: int) -> None:
        try:
            grammar = json_grammar(schema, strict=True)
        except GrammarError as exc:
            STATS["strict"][1] += 1
            assert "schema" in str(exc), str(exc)
            return
        STATS["strict"][0] += 1
        for text in _answers(walker, grammar.text, SEEDS, seed0):
            STATS["strict"][2] += 1
            value = json.loads(text)
            why = schema_errors(value, schema)
            assert why is None, (schema, text, why, grammar.text)

    check()
    built, _, answers = STATS["strict"]
    assert built >= examples // 3 and answers >= built, STATS


# call markup that writes string values bare (Qwen3.5's XML, MiniMax M2's key/value pairs)
# and JSON arguments (Qwen2.5's Hermes calls)
MARKUP_FAMILIES = ("qwen3-xml", "minimax-m2", "hermes")


def _markup_grammar(family: str, tool: dict[str, Any]) -> tuple[Any, Any]:
    """The forced-call grammar of ``tool`` in ``family``'s markup, and its stream layout."""
    layout = stream_layout(by_name(family).schema)
    shape = by_name(family).shape
    if shape is not None:
        return shaped_call_grammar([tool], shape, parallel=False, lazy=False), layout
    assert layout.call_start and layout.call_end
    build = tool_call_grammar if family == "hermes" else xml_tool_call_grammar
    return build([tool], layout.call_start, layout.call_end, parallel=False,
                 lazy=False), layout


@pytest.mark.model
def test_every_strict_call_in_call_markup_validates(walker: GrammarWalker) -> None:
    """The same property for a strict tool's parameters written in call markup, where
    a value is bare text or JSON as the grammar decides and the parser reads it back the
    same way, and as JSON arguments, which the parser reads and coerces: every call a
    random model finishes validates against the parameters."""
    examples = int(os.environ.get("STRICT_FUZZ", "30")) // 2
    done = [0, 0]  # calls built, calls read back

    @settings(max_examples=examples, deadline=None, derandomize="STRICT_FUZZ" not in os.environ,
              suppress_health_check=list(HealthCheck), phases=NO_SHRINK)
    @given(schemas(), schemas(), st.sampled_from(MARKUP_FAMILIES), st.integers(0, 1 << 20))
    def check(first: Any, second: Any, family: str, seed0: int) -> None:
        parameters = {"type": "object", "properties": {"a": first, "b": second},
                      "required": ["a"], "additionalProperties": False}
        tool = {"type": "function", "function": {"name": "f", "strict": True,
                                                 "parameters": parameters}}
        try:
            grammar, layout = _markup_grammar(family, tool)
        except GrammarError as exc:
            assert "schema" in str(exc) or "parameters" in str(exc), str(exc)
            return
        done[0] += 1
        for text in _answers(walker, grammar.text, 3, seed0):
            stream = MessageStream(layout, tools=[tool],
                                   markup_values=markup_values(grammar.markup_values))
            stream.feed(text)
            stream.finish("stop")
            calls = stream.message.tool_calls
            assert len(calls) == 1, (parameters, text)
            done[1] += 1
            why = schema_errors(json.loads(calls[0].arguments), parameters)
            assert why is None, (parameters, family, text, why)

    check()
    assert done[0] >= examples // 3 and done[1] >= done[0], done


@pytest.mark.model
def test_a_loose_answer_breaks_its_schema_only_where_a_relaxation_says_so(
        walker: GrammarWalker) -> None:
    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=NO_SHRINK)
    @given(schemas())
    def check(schema: Any) -> None:
        try:
            grammar = json_grammar(schema)
        except GrammarError:
            return
        for text in _answers(walker, grammar.text, 3):
            why = schema_errors(json.loads(text), schema)
            if why is not None:
                assert grammar.relaxed, (schema, text, why)

    check()


@pytest.mark.model
def test_a_required_name_beside_empty_properties_is_written(walker: GrammarWalker) -> None:
    """``{"properties": {}, "required": ["b"]}`` wrote ``{}`` (the strict fuzz found it):
    a required name missing from ``properties`` is added as a property whenever
    ``properties`` is there, empty or not."""
    schema = {"type": "object", "properties": {}, "required": ["b"]}
    grammar = json_grammar(schema, strict=True)
    for text in _answers(walker, grammar.text, SEEDS):
        value = json.loads(text)
        assert schema_errors(value, schema) is None and "b" in value, text
