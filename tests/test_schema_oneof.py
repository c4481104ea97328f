"""``oneOf`` branches a value could match twice (``engine.constraints.schema_oneof``): served
under strict by writing each branch so that nothing it writes matches another, where they
were a 400. Random walks through llama.cpp's grammar sampler (a random model under the
grammar) must each validate, for every schema drawn in the shapes real schemas use:
mutually exclusive ``required`` beside an object's properties, a discriminating ``const``
with the other names beside, closed branches of different properties."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest
from grammar_walk import GrammarWalker, TextChecker
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from api.chat.answer_check import schema_errors
from conftest import require_model
from engine.constraints.grammar import GrammarError, json_grammar
from engine.constraints.schema_merge import Reading, disjoint

NAMES = ["a", "b", "c", "d", "e"]
VALUES = [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0,
                                               "maximum": 9}, {"type": "boolean"}]


@pytest.fixture(scope="module")
def walker() -> Iterator[GrammarWalker]:
    w = GrammarWalker(require_model("qwen-0.5b"))
    yield w
    w.close()


@st.composite
def exclusive_required(draw: st.DrawFn) -> dict[str, Any]:
    """An object's properties beside ``oneOf: [{"required": [...]}, ...]`` (func.yaml's
    volumes, Glaive's ``calculate_area``): a value holding two branches' names
    matches both."""
    props = {n: draw(st.sampled_from(VALUES)) for n in NAMES}
    sets = draw(st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True),
                         min_size=2, max_size=3))
    schema: dict[str, Any] = {"type": "object", "properties": props,
                              "oneOf": [{"required": s} for s in sets]}
    if draw(st.booleans()):
        schema["required"] = draw(st.lists(st.sampled_from(NAMES), max_size=1))
    if draw(st.booleans()):
        schema["additionalProperties"] = False
    return schema


@st.composite
def discriminated(draw: st.DrawFn) -> dict[str, Any]:
    """One ``kind`` per branch, the names it needs beside it, the rest declared outside."""
    kinds = draw(st.lists(st.sampled_from(["x", "y", "z", 1]), min_size=2, max_size=3,
                          unique=True))
    branches = [{"properties": {"kind": {"const": k}},
                 "required": draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True))}
                for k in kinds]
    return {"type": "object", "required": ["kind"], "oneOf": branches,
            "properties": {"kind": {"enum": kinds}, **{n: VALUES[i % 3]
                                                       for i, n in enumerate(NAMES)}}}


@st.composite
def closed_branches(draw: st.DrawFn) -> dict[str, Any]:
    """Closed objects of different properties (``{}`` matches every one of them)."""
    sets = draw(st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True),
                         min_size=2, max_size=3))
    return {"type": "object", "oneOf": [
        {"type": "object", "additionalProperties": False,
         "properties": {n: VALUES[NAMES.index(n) % 3] for n in s},
         "required": draw(st.lists(st.sampled_from(s), max_size=1))} for s in sets]}


@pytest.mark.model
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(schema=st.one_of(exclusive_required(), discriminated(), closed_branches()),
       seed=st.integers(0, 1 << 20))
def test_every_answer_matches_exactly_one_branch(walker: GrammarWalker,
                                                 schema: dict[str, Any], seed: int) -> None:
    try:
        grammar = json_grammar(schema, strict=True)
    except GrammarError as exc:
        assert "oneOf" in str(exc) or "no value" in str(exc), str(exc)
        return
    assert not grammar.relaxed
    for i in range(6):
        text = walker.walk(grammar.text, np.random.default_rng(seed + i))
        if text is not None:
            value = json.loads(text)
            assert schema_errors(value, schema) is None, (schema, text)


@pytest.mark.parametrize("schema", [
    # func.yaml's volume: one of two sources beside the object's other properties
    {"type": "object", "additionalProperties": False, "required": ["path"],
     "properties": {"secret": {"type": "string"}, "configMap": {"type": "string"},
                    "path": {"type": "string"}},
     "oneOf": [{"required": ["secret"]}, {"required": ["configMap"]}]},
    # Glaive's calculate_area: a shape per branch, its dimensions required
    {"type": "object", "required": ["shape"], "properties": {
        "shape": {"enum": ["circle", "rectangle"]}, "radius": {"type": "number"},
        "width": {"type": "number"}, "length": {"type": "number"}},
     "oneOf": [{"properties": {"shape": {"const": "circle"}}, "required": ["radius"]},
               {"properties": {"shape": {"const": "rectangle"}},
                "required": ["length", "width"]}]},
    # a cursor: next or previous, closed (the empty object matches both)
    {"type": "object", "oneOf": [
        {"additionalProperties": False, "properties": {"next": {"type": "string"}}},
        {"additionalProperties": False, "properties": {"previous": {"type": "string"}}}]},
    # one branch's names a subset of the other's: that branch is left out under strict
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
     "oneOf": [{"required": ["a"]}, {"required": ["a", "b"]}]},
])
def test_overlapping_branches_real_schemas_write_are_served_strict(
        schema: dict[str, Any]) -> None:
    grammar = json_grammar(schema, strict=True)
    assert not grammar.relaxed


def test_branches_no_narrowing_keeps_apart_are_still_refused() -> None:
    for schema in ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 5}]},
                   {"oneOf": [{"type": "object"}, {"required": ["a"]}]}):
        with pytest.raises(GrammarError, match=r"oneOf.*strict"):
            json_grammar(schema, strict=True)
        assert json_grammar(schema).relaxed  # not strict: relaxed, recorded


@pytest.fixture(scope="module")
def checker() -> Iterator[TextChecker]:
    c = TextChecker(require_model("qwen-0.5b"))
    yield c
    c.close()


D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"


@pytest.mark.model
@pytest.mark.parametrize(("schema", "both"), [
    # up to draft 7 a $ref stands alone: the branch is X, any object, whatever beside it
    ({"$schema": D7, "definitions": {"X": {"type": "object"}}, "oneOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
         "additionalProperties": False},
        {"$ref": "#/definitions/X", "additionalProperties": False}]}, '{"a": 1}'),
    ({"$schema": D7, "definitions": {"X": {"type": "object"}}, "oneOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
         "additionalProperties": False},
        {"$ref": "#/definitions/X", "required": ["b"]}]}, '{"a": 1}'),
    # draft 4 has no const: both branches allow any shape
    ({"$schema": D4, "type": "object", "properties": {"shape": {"type": "string"}},
      "required": ["shape"], "oneOf": [{"properties": {"shape": {"const": "a"}}},
                                       {"properties": {"shape": {"const": "b"}}}]},
     '{"shape": "a"}'),
    ({"$schema": D4, "oneOf": [{"const": "a"}, {"const": "b"}]}, '"a"'),
])
def test_branches_are_read_as_the_schemas_draft_reads_them(
        checker: TextChecker, schema: dict[str, Any], both: str) -> None:
    """A proof that no value matches two branches must read them as the validator does: a
    draft-07 ``$ref`` ignores the keywords beside it, and draft 4 has no ``const`` (the
    review found each of these allowed a value valid under both branches)."""
    assert schema_errors(json.loads(both), schema) is not None  # matches both: invalid
    try:
        grammar = json_grammar(schema, strict=True)
    except GrammarError:
        return  # refused: fine
    assert not checker.accepts(grammar.text, both)


def test_proofs_over_shared_references_stay_bounded() -> None:
    """The second review's hangs: properties that all refer back to their object (the proof
    branched over every required one, four deep) and ``allOf`` s of two references, thirty
    deep: each proof reads at most ``schema_merge.PROOF_STEPS`` schemas."""
    k = 20
    a = {"type": "object", "properties": {f"p{i}": {"$ref": "#/$defs/A"} for i in range(k)},
         "required": [f"p{i}" for i in range(k)]}
    deep = {f"D{i}": {"allOf": [{"$ref": f"#/$defs/D{i + 1}"}] * 2} for i in range(30)}
    for schema in ({"$defs": {"A": a}, "oneOf": [{"$ref": "#/$defs/A"}] * 3},
                   {"$defs": {**deep, "D30": {"const": 1}},
                    "oneOf": [{"$ref": "#/$defs/D0"}, {"type": "integer"}]}):
        started = time.monotonic()
        with pytest.raises(GrammarError):
            json_grammar(schema, strict=True)
        assert time.monotonic() - started < 3


def test_draft_3_is_refused_under_strict() -> None:
    schema = {"$schema": "http://json-schema.org/draft-03/schema#", "type": "integer",
              "divisibleBy": 3}
    with pytest.raises(GrammarError, match="draft 3"):
        json_grammar(schema, strict=True)
    assert json_grammar(schema).relaxed


# disjoint's proofs as a property: whatever it calls apart, no value validates under both
LEAVES: list[Any] = [{"type": "null"}, {"type": "string"}, {"type": "integer"},
                     {"enum": ["GET", "POST"]}, {"const": 1}, {"enum": [1.0, None]},
                     {"type": "object"}, {"type": "array"}, {}, {"minimum": 2},
                     {"type": "string", "pattern": "^ab"}, {"type": "string", "pattern": "^b"},
                     {"pattern": "^a"}, {"type": "string", "pattern": "^a|b"},
                     {"type": "string", "pattern": "^a?b"}, {"type": "string", "pattern": "b$"}]
PROBES: list[Any] = [None, "GET", "x", 1, 1.0, 2, 2.5, True, [], [1], {}, "ab", "b", "abc",
                     "bb", "ba", "xa", "a",
                     {"kind": "a"}, {"kind": "b"}, {"kind": "a", "n": 1}, {"kind": 1},
                     {"n": "x"}, {"kind": None}]


@st.composite
def proof_schemas(draw: st.DrawFn, depth: int = 2) -> Any:
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(LEAVES))
    inner = proof_schemas(depth - 1)
    return draw(st.one_of(
        st.fixed_dictionaries({draw(st.sampled_from(["anyOf", "oneOf"])): st.lists(
            inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=2)}),
        st.fixed_dictionaries({"type": st.just("object"), "properties": st.fixed_dictionaries(
            {}, optional={"kind": inner, "n": inner})}, optional={
            "required": st.lists(st.sampled_from(["kind", "n"]), max_size=2, unique=True)}),
        st.fixed_dictionaries({"allOf": st.just([{"type": "object", "required": ["kind"]}]),
                               "properties": st.fixed_dictionaries({"kind": inner})})))


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(proof_schemas(), proof_schemas())
def test_what_disjoint_calls_apart_no_value_matches_twice(a: Any, b: Any) -> None:
    if not disjoint(a, b, lambda ref: None):
        return
    check = jsonschema.Draft202012Validator
    for value in PROBES:
        assert not (check(a).is_valid(value) and check(b).is_valid(value)), (a, b, value)


def test_unions_parts_and_listed_values_are_read_apart() -> None:
    """The refusals these proofs lifted: a null beside listed strings, a union of
    discriminated objects beside another one, a discriminator required in an allOf part."""
    read = Reading(lambda ref: None)
    assert disjoint({"type": "null"}, {"enum": ["GET", "POST"]}, read)

    def tagged(tag: str) -> dict[str, Any]:
        return {"type": "object", "properties": {"type": {"const": tag}}, "required": ["type"]}

    assert disjoint({"oneOf": [tagged("a"), tagged("b")]}, tagged("c"), read)
    assert not disjoint({"oneOf": [tagged("a"), tagged("b")]}, tagged("b"), read)
    parts = {"allOf": [{"type": "object", "required": ["type"]}]}
    assert disjoint({**parts, "properties": {"type": {"enum": ["x"]}}},
                    {**parts, "properties": {"type": {"enum": ["y"]}}}, read)


@pytest.mark.model
def test_branches_told_apart_by_a_discriminator_or_a_pattern_start(
        walker: GrammarWalker) -> None:
    """A discriminator neither branch requires (``{"type": {"enum": ["callback"]}}`` against
    ``["field", "value"]``: an object without it matched both) is made required in each
    branch; anchored patterns that start apart (``^https?://`` and ``^\\./``) cannot both
    match."""
    for schema in (
            {"type": "object", "oneOf": [
                {"properties": {"type": {"enum": ["callback"]}, "value": {"type": "string"}}},
                {"properties": {"type": {"enum": ["field", "value"]},
                                "value": {"type": ["string", "null"]}}}]},
            {"oneOf": [{"type": "string", "pattern": "^https?://.+$"},
                       {"type": "string", "pattern": "^\\./.+$"}]}):
        grammar = json_grammar(schema, strict=True)
        for seed in range(6):
            text = walker.walk(grammar.text, np.random.default_rng(seed))
            if text is not None and "\ufffd" not in text:
                assert schema_errors(json.loads(text), schema) is None, (schema, text)
