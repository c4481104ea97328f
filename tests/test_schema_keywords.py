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
from engine.constraints.grammar import GrammarError, json_grammar, xml_tool_call_grammar
from engine.constraints.grammar_gemma4 import gemma4_call_grammar
from engine.constraints.schema_terms import DISTINCT, ENTRY_COUNT, KEY_PATTERN

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
        if text is None or "\ufffd" in text:
            # (bytes that are no UTF-8: llama.cpp's grammar reads a surrogate or an overlong
            # sequence as a code point, Python as several U+FFFD; a known gap, not the map's)
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
    """The walker's own marker (``KEY_PATTERN``) in a request's schema is left out: any
    key stays allowed, as the validator allows it (read, it would narrow the keys; as a list
    it could hold what no pattern check saw)."""
    for marker in ("^[a-z]+$", ["^[a-z]+$"]):
        schema = {"type": "object", "additionalProperties": {"type": "integer"},
                  KEY_PATTERN: marker}
        g = json_grammar(schema, strict=True).text
        assert checker.accepts(g, '{"AB": 1}') and checker.accepts(g, '{"ab": 1}')
    # nor the counts and the distinct values the walker writes (schema_keywords)
    g = json_grammar({"type": "object", "additionalProperties": {"type": "integer"},
                      ENTRY_COUNT: [1, 1]}, strict=True).text
    assert checker.accepts(g, "{}") and checker.accepts(g, '{"a": 1, "b": 2}')
    g = json_grammar({"type": "array", "items": {"type": "integer"}, DISTINCT: [[7], 1]},
                     strict=True).text
    assert checker.accepts(g, "[]") and checker.accepts(g, "[1, 1]")


@pytest.mark.model
def test_each_key_pattern_is_checked_alone(checker: TextChecker) -> None:
    """Two patterns that are no regex alone must not make one together (``x\\`` and ``y``
    joined were ``x\\|y``, the text "x|y"): each is checked, then grouped in the union; and
    schemas that Python calls equal but JSON does not (1 and true) are two schemas."""
    for patterns in ({"x\\": {}, "y": {}}, {"(a": {}, "b)": {}}):
        with pytest.raises(GrammarError, match="strict"):
            json_grammar({"type": "object", "additionalProperties": False,
                          "patternProperties": patterns}, strict=True)
    with pytest.raises(GrammarError, match="strict"):
        json_grammar({"type": "object", "additionalProperties": False, "patternProperties": {
            "^a$": {"const": 1}, "^b$": {"const": True}}}, strict=True)
    g = json_grammar({"type": "object", "additionalProperties": False, "patternProperties": {
        "^a$": {"type": "integer"}, "b$": {"type": "integer"}}}, strict=True).text
    assert checker.accepts(g, '{"a": 1, "xb": 2}') and checker.accepts(g, '{"ab": 1}')
    assert not checker.accepts(g, '{"ba": 1}') and not checker.accepts(g, '{"c": 1}')


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


@pytest.mark.model
def test_call_markup_writes_listed_non_strings_as_json(checker: TextChecker) -> None:
    """XML and key/value parameters are bare text only where the value is a string: a typed
    or typeless enum of numbers, a ``const`` true, a union, are JSON (the review found a
    typed enum written as any text once its type was left out); a strict tool whose
    parameters are a union at the top is refused, one that is a reference is followed."""
    params = {"type": "object", "required": ["n", "b", "u"], "properties": {
        "n": {"type": "integer", "enum": [1, 2]}, "b": {"const": True},
        "u": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}
    g = xml_tool_call_grammar([_tool(params)], "<tool_call>", "</tool_call>",
                              parallel=False, lazy=False).text

    def call(n: str, b: str, u: str) -> str:
        return ("<tool_call>\n<function=f>\n" + "".join(
            f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in (("n", n), ("b", b), ("u", u)))
            + "</function>\n</tool_call>")

    assert checker.accepts(g, call("2", "true", "null"))
    assert checker.accepts(g, call("1", "true", "7"))
    for bad in (call("abc", "true", "1"), call("3", "true", "1"), call("1", "yes", "1"),
                call("1", "true", "abc")):
        assert not checker.accepts(g, bad), bad
    union = {"anyOf": [params, {"type": "object", "properties": {"z": {"type": "string"}}}]}
    with pytest.raises(GrammarError, match="strict"):
        xml_tool_call_grammar([_tool(union)], "<tool_call>", "</tool_call>", parallel=False,
                              lazy=False)
    ref = {"$defs": {"P": params}, "$ref": "#/$defs/P"}
    g = xml_tool_call_grammar([_tool(ref)], "<tool_call>", "</tool_call>", parallel=False,
                              lazy=False).text
    assert checker.accepts(g, call("2", "true", "null"))
    assert not checker.accepts(g, "<tool_call>\n<function=f>\n<parameter=x>\nabc\n"
                                  "</parameter>\n</function>\n</tool_call>")


def test_call_markup_records_what_it_widens_and_refuses_it_under_strict() -> None:
    """Not strict, a map tool's parameters stay any (key/value markup writes no pattern for
    a key), recorded as relaxed; strict, parameters that are no object are a 400."""
    m = {"type": "object", "additionalProperties": False,
         "patternProperties": {"^[a-z]+$": {"type": "integer"}}}
    loose = xml_tool_call_grammar([_tool(m, strict=False)], "<tool_call>", "</tool_call>",
                                  parallel=False, lazy=False)
    assert "xml-any-parameter*" in loose.text and loose.relaxed
    for params in ({"type": "string"}, {"$defs": {"S": {"type": "string"}},
                                        "$ref": "#/$defs/S"}):
        with pytest.raises(GrammarError, match="strict"):
            xml_tool_call_grammar([_tool(params)], "<tool_call>", "</tool_call>",
                                  parallel=False, lazy=False)


# maps with a count of entries (schema_keywords._entries): the shapes MaskBench's strict
# refusals hold (`{"type": "object", "minProperties": 1}`, a typed map with
# `minProperties: 1`, a map of patterns with counts)
MAP_SHAPES: list[dict[str, Any]] = [
    {"type": "object"}, {"type": "object", "properties": {}},
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}},
    {"type": "object", "additionalProperties": False,
     "patternProperties": {"^[a-z]{1,3}$": {"type": "string", "maxLength": 2}}},
    {"patternProperties": {"^x": {"type": "boolean"}}},
    {"type": "object", "additionalProperties": False}]


def _walks_validate(walker: GrammarWalker, grammar: str, schema: Any, seed: int) -> None:
    """Four random walks of ``grammar``: each that ends validates under ``schema``."""
    for i in range(4):
        text = walker.walk(grammar, np.random.default_rng(seed + i))
        if text is None or "\ufffd" in text:
            continue  # (see test_a_maps_keys_match_its_patterns)
        assert schema_errors(json.loads(text), schema) is None, (schema, text)


@pytest.mark.model
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=st.sampled_from(MAP_SHAPES), low=st.sampled_from([None, 0, 1, 2]),
       high=st.sampled_from([None, 0, 1, 2, 3]), seed=st.integers(0, 1 << 20))
def test_a_maps_count_of_entries_holds(walker: GrammarWalker, shape: dict[str, Any],
                                       low: int | None, high: int | None, seed: int) -> None:
    """Every walk validates; at least two keys (a key written twice is one) stay refused."""
    schema = {**shape, **({} if low is None else {"minProperties": low}),
              **({} if high is None else {"maxProperties": high})}
    try:
        grammar = json_grammar(schema, strict=True)
    except GrammarError as exc:
        assert (low or 0) >= 2 or ((low or 0) > (high if high is not None else 9)) or (
            low and shape.get("additionalProperties") is False and
            "patternProperties" not in shape), (schema, exc)
        return
    assert not grammar.relaxed
    _walks_validate(walker, grammar.text, schema, seed)


@pytest.mark.model
def test_a_maps_count_is_enforced_in_json_and_gemma_4(checker: TextChecker) -> None:
    g = json_grammar({"type": "object", "additionalProperties": {"type": "integer"},
                      "minProperties": 1, "maxProperties": 2}, strict=True).text
    assert checker.accepts(g, '{"a": 1}') and checker.accepts(g, '{"a": 1, "b": 2}')
    assert not checker.accepts(g, "{}") and not checker.accepts(g, '{"a": 1, "b": 2, "c": 3}')
    g = json_grammar({"type": "object", "minProperties": 1}, strict=True).text
    assert checker.accepts(g, '{"k": [1, {"x": null}]}') and not checker.accepts(g, "{}")
    # the type says which keywords apply: none of an object's to a string
    g = json_grammar({"type": "string", "minProperties": 1, "uniqueItems": True},
                     strict=True).text
    assert checker.accepts(g, '"abc"')
    g = gemma4_call_grammar([_tool({"type": "object", "required": ["m"], "properties": {
        "m": {"type": "object", "additionalProperties": {"type": "integer"},
              "minProperties": 1, "maxProperties": 2}}})], "<|tool_call>", "<tool_call|>",
        parallel=False, lazy=False).text
    for args, ok in (("m:{a:1}", True), ("m:{a:1,b:2}", True), ("m:{}", False),
                     ("m:{a:1,b:2,c:3}", False)):
        assert checker.accepts(g, "<|tool_call>call:f{" + args + "}<tool_call|>") == ok, args
    # call markup writes no key of a map at the top: one that needs a key is refused
    with pytest.raises(GrammarError, match="strict"):
        xml_tool_call_grammar([_tool({"type": "object", "minProperties": 1})], "<tool_call>",
                              "</tool_call>", parallel=False, lazy=False)
    with pytest.raises(GrammarError, match="Gemma 4"):
        gemma4_call_grammar([_tool({"type": "object", "properties": {"p": {
            "type": "object", "additionalProperties": False, "minProperties": 1,
            "patternProperties": {"^a$": {"type": "integer"}}}}})], "<|tool_call>",
            "<tool_call|>", parallel=False, lazy=False)


def test_dependencies_are_read_together() -> None:
    """``dependentRequired`` beside ``dependencies``: both are read (the second was dropped
    once the first could be written, so a key the object's other keys allowed went without
    the names it needs); a dependency schema that says only ``required`` is those names,
    and a key a closed object never writes needs nothing."""
    props = {"a": {"type": "string"}, "b": {"type": "string"}}
    with pytest.raises(GrammarError, match="strict"):
        json_grammar({"type": "object", "properties": props, "additionalProperties": {
            "type": "integer"}, "dependentRequired": {"a": ["b"]},
            "dependencies": {"c": ["d"]}}, strict=True)
    g = json_grammar({"type": "object", "properties": props, "dependencies": {
        "a": {"required": ["b"]}, "zz": ["q"]}}, strict=True)
    assert not g.relaxed


# arrays of distinct listed values (schema_keywords._distinct): MaskBench's strict refusals
# of `uniqueItems` hold such arrays (`"items": {"enum": [...]}, "uniqueItems": true`)
@pytest.mark.model
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=st.lists(st.sampled_from([1, 1.0, 2, "a", "b", None, True, [1], {"k": 1}]),
                       min_size=1, max_size=6),
       low=st.sampled_from([None, 0, 1, 2]), high=st.sampled_from([None, 1, 3, 9]),
       typed=st.booleans(), seed=st.integers(0, 1 << 20))
def test_an_array_of_distinct_listed_values_holds(
        walker: GrammarWalker, values: list[Any], low: int | None, high: int | None,
        typed: bool, seed: int) -> None:
    items: dict[str, Any] = {"enum": values, **({"type": "integer"} if typed else {})}
    schema = {"type": "array", "items": items, "uniqueItems": True,
              **({} if low is None else {"minItems": low}),
              **({} if high is None else {"maxItems": high})}
    try:
        grammar = json_grammar(schema, strict=True)
    except GrammarError:
        return  # (more items asked for than one, a cap under the values' number: refused)
    for i in range(4):
        text = walker.walk(grammar.text, np.random.default_rng(seed + i))
        if text is None:
            continue
        assert schema_errors(json.loads(text), schema) is None, (schema, text)


@pytest.mark.model
def test_distinct_values_are_written_once_each(checker: TextChecker) -> None:
    schema = {"type": "array", "items": {"$ref": "#/$defs/S"}, "uniqueItems": True,
              "minItems": 1, "$defs": {"S": {"type": "string", "enum": ["r", "w", "x"]}}}
    g = json_grammar(schema, strict=True)
    assert not g.relaxed
    for ok in ('["r"]', '["r", "x"]', '["r", "w", "x"]', '["w"]'):
        assert checker.accepts(g.text, ok), ok
    for bad in ("[]", '["r", "r"]', '["w", "w"]', '["q"]'):
        assert not checker.accepts(g.text, bad), bad
    g4 = gemma4_call_grammar([_tool({"type": "object", "required": ["p"], "properties": {
        "p": schema}, "$defs": schema["$defs"]})], "<|tool_call>", "<tool_call|>",
        parallel=False, lazy=False).text
    q = '<|"|>'
    for args, ok in ((f"p:[{q}r{q},{q}x{q}]", True), (f"p:[{q}r{q},{q}r{q}]", False),
                     ("p:[]", False)):
        assert checker.accepts(g4, "<|tool_call>call:f{" + args + "}<tool_call|>") == ok, args


@pytest.mark.model
def test_not_required_leaves_a_name_out_of_a_closed_object(checker: TextChecker) -> None:
    """``not: {"required": [a, b]}``: one of the names is never written (the one the object
    does not require); every name required, or ``not: {}``, allows no value."""
    props = {"a": {"type": "integer"}, "b": {"type": "integer"}}
    g = json_grammar({"type": "object", "properties": props, "required": ["b"],
                      "not": {"required": ["a", "b"]}}, strict=True).text
    assert checker.accepts(g, '{"b": 1}') and not checker.accepts(g, '{"a": 1, "b": 2}')
    for schema in ({"type": "object", "properties": props, "required": ["a", "b"],
                    "not": {"required": ["a", "b"]}}, {"type": "string", "not": {}}):
        with pytest.raises(GrammarError, match=r"no value|required"):
            json_grammar(schema, strict=True)
    g = json_grammar({"type": "string", "maxLength": 2, "not": False}, strict=True)
    assert not g.relaxed and checker.accepts(g.text, '"ab"')


NAME_SHAPES: list[dict[str, Any]] = [
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
     "propertyNames": {"pattern": "^[a-c]{1,2}$"}},
    {"type": "object", "propertyNames": {"$ref": "#/$defs/Name"},
     "$defs": {"Name": {"type": "string", "pattern": "x$"}}},
    {"type": "object", "additionalProperties": {"type": "boolean"},
     "propertyNames": {"enum": ["on", "off"]}},
    {"type": "object", "propertyNames": {"type": "string"}, "maxProperties": 2}]


@pytest.mark.model
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=st.sampled_from(NAME_SHAPES), seed=st.integers(0, 1 << 20))
def test_a_maps_property_names_hold(walker: GrammarWalker, shape: dict[str, Any],
                                    seed: int) -> None:
    """``propertyNames`` of a map (MaskBench's strict refusals): a pattern is its keys,
    listed names its only keys, a string type says nothing."""
    grammar = json_grammar(shape, strict=True)
    assert not grammar.relaxed
    _walks_validate(walker, grammar.text, shape, seed)


@pytest.mark.model
def test_the_reviews_breaches_stay_closed(checker: TextChecker) -> None:
    """What a review of this round found: each wrote a value jsonschema refuses, or broke."""
    props = {"a": {"type": "integer"}}
    # not: {required} says nothing of a string: beside a type list, a string fails it
    with pytest.raises(GrammarError, match="strict"):
        json_grammar({"type": ["object", "string"], "properties": props,
                      "additionalProperties": False, "not": {"required": ["a"]}}, strict=True)
    # a map's keys are not its declared properties: {"a": 1} matched the refused name
    for m in ({"type": "object", "properties": {}, "propertyNames": {"pattern": "^a$"}},
              {"type": "object", "properties": {}, "additionalProperties": False,
               "patternProperties": {"^a$": {"type": "integer"}}}):
        try:
            g = json_grammar({**m, "not": {"required": ["a"]}}, strict=True).text
        except GrammarError:
            continue
        assert not checker.accepts(g, '{"a": 1}'), m
    # items read in their own draft: 1.0 is no integer in draft 4
    with pytest.raises(GrammarError, match="strict"):
        json_grammar({"type": "array", "uniqueItems": True, "items": {
            "$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
            "enum": [1.0, 2]}}, strict=True)
    # a type list's null branch takes no array marker (Gemma 4 wrote JSON quotes)
    tags = {"type": "array", "nullable": True, "uniqueItems": True,
            "items": {"enum": ["x", "y"]}}
    g4 = gemma4_call_grammar([_tool({"type": "object", "required": ["t"], "properties": {
        "t": tags}}, strict=False)], "<|tool_call>", "<tool_call|>", parallel=False,
        lazy=False).text
    q = '<|"|>'
    for args, ok in ((f"t:[{q}x{q}]", True), ("t:null", True), ('t:["x"]', False)):
        assert checker.accepts(g4, "<|tool_call>call:f{" + args + "}<tool_call|>") == ok, args
    # odd types in a proof's allOf part: a 400, not a crash
    for bad in ({"oneOf": [{"allOf": [{"type": [{}]}]}, {}]},
                {"oneOf": [{"type": [{}]}, {"type": "integer"}]}):
        with pytest.raises(GrammarError):
            json_grammar(bad, strict=True)
    # no key may stand beside a count of entries: {} only
    for strict in (True, False):
        g = json_grammar({"type": "object", "additionalProperties": {"not": {}},
                          "maxProperties": 2}, strict=strict).text
        assert checker.accepts(g, "{}") and not checker.accepts(g, '{"k": 1}')


@pytest.mark.model
def test_a_rebased_reference_and_an_old_drafts_prefix_items(checker: TextChecker) -> None:
    """Two older gaps the review found: a ``$ref`` inside a subschema with its own ``$id``
    resolves against that subschema (the walk resolved it from the root: ``{"a": 1}`` for
    a string), and before 2020-12 ``prefixItems`` is no keyword (its tuple was written
    alone, ``["x"]``, where every item must be an integer)."""
    rebased = {"$defs": {"x": {"type": "integer"}}, "type": "object", "required": ["a"],
               "additionalProperties": False, "properties": {"a": {
                   "$id": "http://e.com/a", "$defs": {"x": {"type": "string"}},
                   "$ref": "#/$defs/x"}}}
    with pytest.raises(GrammarError, match=r"\$id"):
        json_grammar(rebased, strict=True)
    assert json_grammar(rebased).relaxed
    anchor = {**rebased, "properties": {"a": {"$id": "#a", "$ref": "#/$defs/x"}}}
    assert not json_grammar(anchor, strict=True).relaxed  # an anchor is no new base
    old = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
           "prefixItems": [{"type": "string"}], "items": {"type": "integer"}}
    g = json_grammar(old, strict=True).text
    assert not checker.accepts(g, '["x"]') and checker.accepts(g, "[1, 2]")


@pytest.mark.model
def test_the_second_reviews_findings_stay_closed(checker: TextChecker) -> None:
    """A draft is read from the exact ``$schema`` address, as jsonschema reads it (an
    https draft-04 address names none: 2020-12, where ``$id`` rebases); ``items: false``
    with no tuple allows no item; a boolean ``exclusiveMinimum`` outside draft 4 is a
    number to jsonschema (``true`` is 1), refused under strict; a branch's property under
    ``false`` is never the one made required."""
    with pytest.raises(GrammarError, match=r"\$id"):
        json_grammar({"$schema": "https://json-schema.org/draft-04/schema#", "type": "object",
                      "required": ["a"], "properties": {"a": {
                          "$id": "http://x/a", "$ref": "#/$defs/s",
                          "$defs": {"s": {"type": "integer"}}}},
                      "$defs": {"s": {"type": "string"}}}, strict=True)
    for schema in ({"type": "array", "items": False},
                   {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                    "prefixItems": [{"type": "string"}], "items": False}):
        g = json_grammar(schema, strict=True).text
        assert checker.accepts(g, "[]") and not checker.accepts(g, '["x"]'), schema
    bounded = {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 3}
    with pytest.raises(GrammarError, match="exclusiveMinimum"):
        json_grammar(bounded, strict=True)
    assert json_grammar(bounded).relaxed
    g = json_grammar({**bounded, "$schema": "http://json-schema.org/draft-04/schema#"},
                     strict=True).text
    assert checker.accepts(g, "1") and not checker.accepts(g, "0")
    json_grammar({"oneOf": [
        {"properties": {"k": False, "a": {"type": "string"}}, "additionalProperties": False},
        {"properties": {"k": {"const": 1}, "b": {"type": "string"}}}]}, strict=True)


@pytest.mark.model
def test_item_counts_hold_in_a_type_lists_array_branch(checker: TextChecker) -> None:
    """The array branch of a type list (and a typeless schema) with counts but no ``items``
    was the converter's bare array, counts ignored: ``[1, 2]`` under ``maxItems: 1``."""
    for schema, ok, bad in (({"type": ["array", "string"], "maxItems": 1}, '[1]', '[1, 2]'),
                            ({"type": ["array", "null"], "items": False}, "[]", "[1]"),
                            ({"items": False}, "[]", "[1]")):
        g = json_grammar(schema, strict=True).text
        assert checker.accepts(g, ok) and not checker.accepts(g, bad), schema
