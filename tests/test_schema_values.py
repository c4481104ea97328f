"""Listed values checked against the whole schema (``engine.constraints.schema_values``): a
schema that lists its values (``enum``, ``const``, itself or in an ``allOf`` part) beside
keywords no grammar holds (``not``, ``if``, ``uniqueItems``, ``contains`` ...) is served
exactly under strict, where it was a 400: llama.cpp's grammar sampler allows a listed
value exactly when the validator calls it valid."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from grammar_walk import TextChecker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.chat.answer_check import schema_errors
from conftest import require_model
from engine.constraints.grammar import GrammarError, json_grammar
from engine.constraints.schema_merge import disjoint, value_key

POOL: list[Any] = [0, 1, 1.0, 2, 2.5, -3, 10, "a", "bb", "", None, True, False, [], [1, 1],
                   [1, 2], [2, "a"], {}, {"a": 1}, {"a": "x", "b": 2}, {"b": None},
                   # what JSON escapes (a grammar llama.cpp could not parse, or that wrote a
                   # raw line break into the string), and what is not ASCII
                   'a"b', "c\\d", "x\ny", "café", {'k"': "\\"}]
# keywords a grammar cannot hold in general, each beside the listed values
BESIDE: list[dict[str, Any]] = [
    {"not": {"const": 1}}, {"not": {"type": "string"}}, {"not": {"enum": [[], {}]}},
    {"uniqueItems": True}, {"contains": {"const": 1}}, {"minProperties": 1},
    {"if": {"type": "integer"}, "then": {"minimum": 1}, "else": {"type": ["string", "array"]}},
    {"multipleOf": 0.5}, {"dependentRequired": {"a": ["b"]}},
    {"anyOf": [{"type": "integer"}, {"minLength": 1}]},
    {"oneOf": [{"type": "number"}, {"type": "integer"}]},
    {"patternProperties": {"^a$": {"type": "string"}}}, {"propertyNames": {"maxLength": 0}},
    {"allOf": [{"not": {"type": "null"}}, {"not": {"const": "bb"}}]},
    # a list of types: the converter writes it before the values (a MaskBench breach)
    {"type": ["string", "null"]}, {"type": ["integer", "string", "array"]},
]


@pytest.fixture(scope="module")
def checker() -> Iterator[TextChecker]:
    c = TextChecker(require_model("qwen-0.5b"))
    yield c
    c.close()


def _unique(values: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for v in values:
        seen.setdefault(value_key(v), v)
    return list(seen.values())


@pytest.mark.model
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=st.lists(st.sampled_from(POOL), min_size=1, max_size=6).map(_unique),
       beside=st.lists(st.sampled_from(BESIDE), min_size=1, max_size=2),
       where=st.sampled_from(["beside", "allOf", "allOf-ref", "const"]))
def test_listed_values_are_allowed_exactly_when_valid(
        checker: TextChecker, values: list[Any], beside: list[dict[str, Any]],
        where: str) -> None:
    rest: dict[str, Any] = {k: v for part in beside for k, v in part.items()}
    listing: dict[str, Any] = {"const": values[0]} if where == "const" else {"enum": values}
    if where == "beside" or where == "const":
        schema = {**listing, **rest}
    elif where == "allOf":
        schema = {"allOf": [listing, rest]}
    else:
        schema = {"$defs": {"v": listing}, "allOf": [{"$ref": "#/$defs/v"}, rest]}
    listed = values[:1] if where == "const" else values
    valid = {value_key(v) for v in listed if schema_errors(v, schema) is None}
    try:
        grammar = json_grammar(schema, strict=True)
    except GrammarError as exc:
        assert not valid and "no listed value" in str(exc), (schema, str(exc))
        return
    assert not grammar.relaxed
    for v in listed:
        assert checker.accepts(grammar.text, json.dumps(v, ensure_ascii=False)) == (
            value_key(v) in valid), (schema, v)
    assert not checker.accepts(grammar.text, json.dumps("zz-not-listed"))


@pytest.mark.model
def test_equal_numbers_are_one_value(checker: TextChecker) -> None:
    """``1`` and ``1.0`` are one value to JSON Schema: two ``oneOf`` branches listing them
    were taken as disjoint (their JSON texts differ), so a value matching both was
    written under strict."""
    assert not disjoint({"enum": [1, 5]}, {"const": 1.0}, lambda ref: None)
    assert not disjoint({"const": {"a": [2.0]}}, {"const": {"a": [2]}}, lambda ref: None)
    assert disjoint({"const": 1}, {"const": True}, lambda ref: None)  # JSON: not equal
    schema = {"oneOf": [{"const": 1}, {"enum": [1.0, 2]}]}
    assert schema_errors(1, schema) is not None
    try:
        grammar = json_grammar(schema, strict=True)
    except GrammarError:
        return  # refused: fine; written: never 1
    assert not checker.accepts(grammar.text, "1") and not checker.accepts(grammar.text, "1.0")


def test_listed_values_beside_a_keyword_the_validator_cannot_read_are_refused() -> None:
    """Values that cannot be checked (a remote reference beside them) stay refused under
    strict, relaxed and recorded otherwise."""
    schema = {"enum": ["a", "b"], "not": {"$ref": "https://example.com/s.json"}}
    with pytest.raises(GrammarError, match="strict"):
        json_grammar(schema, strict=True)
    assert json_grammar(schema).relaxed


@pytest.mark.parametrize("schema", [
    # a request's own regex on its own values, one that backtracks: Python's re takes hours
    # over 40 characters, the GIL held (schema_values._linear)
    {"enum": ["a" * 40 + "!"], "pattern": "^(a+)+$"},
    {"enum": [{"a" * 40 + "!": 1}], "patternProperties": {"^(a+)+$": {}}},
    # references that double at each level: 2**30 subschemas for one value
    {"$defs": {f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}] * 2} for i in range(30)}
     | {"a30": {"type": "integer"}}, "enum": [1, 2, 3], "not": {"$ref": "#/$defs/a0"}},
])
def test_a_value_check_that_could_run_unbounded_is_not_made(schema: dict[str, Any]) -> None:
    """Listed values are checked only where the validator's work is bounded
    (``schema_values.checkable``): otherwise strict refuses them at once, and without
    strict they are relaxed, recorded."""
    started = time.monotonic()
    with pytest.raises(GrammarError, match="strict mode cannot enforce"):
        json_grammar(schema, strict=True)
    assert json_grammar(schema).relaxed
    assert time.monotonic() - started < 5


def test_a_long_enum_is_checked_once_per_value() -> None:
    """Each value is checked against the schema without its own list (jsonschema's
    ``enum`` compares a value with every listed one: 50 properties of 1,000 values took
    15 s of CPU that way)."""
    props = {f"p{j}": {"type": "string", "enum": [f"v{i}" for i in range(1000)]}
             for j in range(50)}
    started = time.monotonic()
    json_grammar({"type": "object", "properties": props}, strict=True)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("schema", [
    {"enum": ["\\" * 60 + "!"], "pattern": "^\\\\*\\\\*\\\\*\\\\*\\\\*\\\\*x"},
    {"enum": ["a" * 40 + "!"], "pattern": "^(a|a){,40}$"},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
     "items": [{"type": "string", "pattern": "^(a+)+$"}], "enum": [["a" * 40 + "!"]]},
    {"type": "object", "patternProperties": {"^x": {"type": "string", "pattern": "^(a+)+$"}},
     "enum": [{"x": "a" * 40 + "!"}]},
    {"type": "array", "uniqueItems": True, "enum": [[{"": i} for i in range(3000)], []]},
    {"enum": [{"z": 1}], **{"anyOf": [{"required": ["z"]}], "unevaluatedProperties": False}},
])
def test_the_validator_is_never_run_unbounded(schema: dict[str, Any]) -> None:
    """The second review's hangs: a quantifier after an escape, a bounded repeat of an
    alternation, a regex in a tuple's items or a map's values, pairwise uniqueness of
    thousands of values, evaluated properties: each is left to the keyword rules (relaxed,
    or refused under strict) in well under a second."""
    started = time.monotonic()
    with contextlib.suppress(GrammarError):
        json_grammar(schema, strict=True)
    json_grammar(schema)
    assert time.monotonic() - started < 3


@pytest.mark.model
def test_values_are_checked_against_everything_but_their_own_list(checker: TextChecker) -> None:
    """``const`` beside ``enum``: both hold (the first mend dropped both); a subschema's
    own ``$schema`` does not swap the root's validator for jsonschema's (which divides
    floats for ``multipleOf``)."""
    schema: dict[str, Any] = {"const": "a", "enum": ["b", "c"]}
    with pytest.raises(GrammarError, match="no listed value"):
        json_grammar(schema, strict=True)
    schema = {"const": "b", "enum": ["b", "c"]}
    g = json_grammar(schema, strict=True).text
    assert checker.accepts(g, '"b"') and not checker.accepts(g, '"c"')
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "multipleOf": 0.3,
              "enum": [100000000000000001, 0.6]}
    g = json_grammar(schema, strict=True).text
    assert checker.accepts(g, "0.6") and not checker.accepts(g, "100000000000000001")
    assert schema_errors(100000000000000001, schema) is not None


def test_a_subschema_of_another_draft_is_refused_under_strict() -> None:
    """jsonschema reads a subschema that names its own ``$schema`` in that draft (a draft-4
    subtree calls 1.0 no integer; a draft-3 one reads ``disallow``); this project reads
    every subschema as the root: such a subtree is refused under strict, recorded without
    it, and one that names the root's own draft is served."""
    d4, d7 = "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"
    for schema in ({"properties": {"a": {"$schema": d4, "type": "integer", "enum": [1.0, 2]}}},
                   {"properties": {"a": {"$schema": d4.replace("04", "03"),
                                         "disallow": "string"}}}):
        with pytest.raises(GrammarError, match="draft other than the root"):
            json_grammar(schema, strict=True)
        assert json_grammar(schema).relaxed
    assert not json_grammar({"$schema": d7, "properties": {"a": {"$schema": d7,
                                                                "type": "integer"}}},
                            strict=True).relaxed


@pytest.mark.model
def test_a_lone_surrogate_in_a_listed_value_is_written_as_its_escape(
        checker: TextChecker) -> None:
    """JSON writes a lone surrogate only as an escape (no UTF-8 text holds one): the
    grammar must too, or its text cannot even be encoded for llama.cpp."""
    grammar = json_grammar({"enum": ["\ud800x", "ok"]}, strict=True)
    grammar.text.encode()
    assert checker.accepts(grammar.text, '"\\ud800x"')
    assert checker.accepts(grammar.text, '"ok"')
