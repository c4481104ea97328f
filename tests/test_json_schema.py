"""JSON Schemas as tools, response formats and text formats: one builder, every shape
Pydantic and OpenAI produce. Grammars are parsed by llama.cpp itself, and valid (and
invalid) instances are run through the grammar sampler token by token."""

from __future__ import annotations

import json
import math
import os
import re
import signal
from collections.abc import Iterator
from enum import Enum
from typing import Any, Literal, Optional

import pytest
from grammar_walk import TextChecker
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from api.chat.answer_check import schema_errors
from conftest import require_model
from engine.constraints.grammar import (
    MAX_GRAMMAR_BYTES,
    MAX_GRAMMAR_DEPTH,
    Grammar,
    GrammarError,
    bare_call_grammar,
    bounded,
    json_grammar,
    tool_call_grammar,
    xml_tool_call_grammar,
)
from engine.constraints.json_schema import (
    ENUM_LIMIT,
    MAX_SCHEMA_NODES,
    REPEAT_LIMIT,
    SchemaError,
    SchemaSet,
    relax_pattern,
)
from fuzz_schemas import PATTERN_ALPHABET


class Color(str, Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str
    city: str


class Person(BaseModel):
    name: str
    age: int
    addresses: list[Address]
    favorite: Color
    nickname: Optional[str] = None  # noqa: UP045 (Pydantic's anyOf + null)


class Node(BaseModel):
    value: int
    children: list[Node] = []


class Shape(BaseModel):
    kind: Literal["circle", "square"]
    size: float
    tags: dict[str, int] = {}


SCHEMAS: dict[str, tuple[dict[str, Any], list[Any], list[Any]]] = {
    # name: (schema, valid instances, invalid instances)
    "nested model with $defs, list and enum": (
        Person.model_json_schema(),
        [Person(name="Ann", age=3, addresses=[Address(street="Main", city="Rome")],
                favorite=Color.RED).model_dump(mode="json")],
        [{"name": "Ann", "age": 3, "addresses": [], "favorite": "blue", "nickname": None}]),
    "recursive model": (
        Node.model_json_schema(),
        [Node(value=1, children=[Node(value=2, children=[Node(value=3)])]).model_dump()],
        [{"value": "x", "children": []}]),
    "literal, float and dict": (
        Shape.model_json_schema(),
        [Shape(kind="circle", size=1.5, tags={"a": 1}).model_dump()],
        [{"kind": "triangle", "size": 1, "tags": {}}]),
    "root recursion through #": (
        {"type": "object", "properties": {"name": {"type": "string"},
                                          "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
         "required": ["name", "next"], "additionalProperties": False},
        [{"name": "a", "next": {"name": "b", "next": None}}],
        [{"name": "a", "next": 3}]),
    "draft-4 definitions and nullable type list": (
        {"type": "object", "definitions": {"Unit": {"type": "string", "enum": ["c", "f"]}},
         "properties": {"unit": {"$ref": "#/definitions/Unit"},
                        "temp": {"type": ["number", "null"]}},
         "required": ["unit", "temp"], "strict": True},
        [{"unit": "c", "temp": None}, {"unit": "f", "temp": 21.5}],
        [{"unit": "k", "temp": 1}]),
    "oneOf, const and annotations": (
        {"title": "Event", "oneOf": [
            {"type": "object", "properties": {"t": {"const": "a"}, "n": {"type": "integer"}},
             "required": ["t", "n"], "description": "an a"},
            {"type": "object", "properties": {"t": {"const": "b"}}, "required": ["t"]}]},
        [{"t": "a", "n": 1}, {"t": "b"}],
        [{"t": "c"}]),
    "any-value fields": (
        {"type": "object", "properties": {"x": {}, "y": {"title": "Y"}, "z": True},
         "required": ["x", "y", "z"]},
        [{"x": 1, "y": "s", "z": [1, {"a": None}]}],
        [{"x": 1}]),
}


# -- schema rewriting, no model -------------------------------------------------------
def test_refs_point_into_one_shared_defs_with_names_unique_per_schema() -> None:
    schemas = SchemaSet()
    a = schemas.add({"$defs": {"Address": {"type": "string"}},
                     "properties": {"a": {"$ref": "#/$defs/Address"}}})
    b = schemas.add({"$defs": {"Address": {"type": "integer"}},
                     "properties": {"a": {"$ref": "#/$defs/Address"}}})
    ka, kb = a["properties"]["a"]["$ref"], b["properties"]["a"]["$ref"]
    assert ka != kb
    assert schemas.defs[ka.rsplit("/", 1)[1]] == {"type": "string"}
    assert schemas.defs[kb.rsplit("/", 1)[1]] == {"type": "integer"}


@pytest.mark.parametrize(("schema", "words"), [
    ({"$ref": "https://example.com/s.json"}, ["$ref", "local"]),
    ({"properties": {"a": {"$ref": "#/$defs/Missing"}}}, ["properties.a.$ref", "nothing"]),
    ({"type": "strin"}, ["type", "strin"]),
    ({"properties": []}, ["properties"]),
    ({"enum": []}, ["enum"]),
    ({"anyOf": {}}, ["anyOf"]),
])
def test_schemas_that_cannot_compile_name_the_keyword(schema: dict[str, Any],
                                                      words: list[str]) -> None:
    with pytest.raises(SchemaError) as err:
        SchemaSet().add(schema)
    assert all(w in str(err.value) for w in words), str(err.value)
    with pytest.raises(GrammarError):
        json_grammar(schema)


def test_a_non_strict_tool_that_cannot_compile_gets_any_object_and_a_strict_one_a_400(
        ) -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "http://x/y"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": bad}}
    grammar = tool_call_grammar([tool], "<tool_call>", "</tool_call>", parallel=False,
                                lazy=False)
    assert '"\\"f\\""' in grammar.text or '\\"f\\"' in grammar.text
    strict = {"type": "function", "function": {"name": "f", "parameters": bad, "strict": True}}
    with pytest.raises(GrammarError, match=r"'f'.*\$ref"):
        tool_call_grammar([strict], "<tool_call>", "</tool_call>", parallel=False, lazy=False)


# -- llama.cpp parses the grammar and runs instances through it -----------------------
class GrammarChecker(TextChecker):
    def accepts(self, grammar: Grammar, text: str) -> bool:  # type: ignore[override]
        return super().accepts(grammar.text, text)


@pytest.fixture(scope="module")
def checker() -> Iterator[GrammarChecker]:
    c = GrammarChecker(require_model("qwen-0.5b"))
    yield c
    c.close()


def _tool(schema: dict[str, Any], name: str = "record") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


@pytest.mark.model
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_path_compiles_and_accepts_valid_instances_only(
        checker: GrammarChecker, name: str) -> None:
    schema, valid, invalid = SCHEMAS[name]
    weather = _tool({"type": "object", "properties": {"city": {"type": "string"}}}, "weather")
    fmt = json_grammar(schema)  # response_format / text.format
    hermes = tool_call_grammar([_tool(schema), weather], "<tool_call>", "</tool_call>",
                               parallel=True, lazy=False)
    bare = bare_call_grammar([weather, _tool(schema)])
    xml = xml_tool_call_grammar([_tool(schema)], "<tool_call>", "</tool_call>",
                                parallel=False, lazy=True)
    assert checker.sampler(xml.text)  # parses (XML values: the real-model tests)
    for value in valid:
        args = json.dumps(value)
        assert checker.accepts(fmt, args), (name, args)
        block = f'<tool_call>\n{{"name": "record", "arguments": {args}}}\n</tool_call>'
        assert checker.accepts(hermes, block), (name, block)
        assert checker.accepts(bare, f'{{"name": "record", "arguments": {args}}}')
    for value in invalid:
        args = json.dumps(value)
        assert not checker.accepts(fmt, args), (name, args)
        block = f'<tool_call>\n{{"name": "record", "arguments": {args}}}\n</tool_call>'
        assert not checker.accepts(hermes, block), (name, block)


@pytest.mark.model
def test_two_tools_defining_the_same_name_keep_their_own_definitions(
        checker: GrammarChecker) -> None:
    a = _tool({"$defs": {"Unit": {"enum": ["c", "f"]}},
               "properties": {"u": {"$ref": "#/$defs/Unit"}}, "required": ["u"]}, "a")
    b = _tool({"$defs": {"Unit": {"enum": ["km", "mi"]}},
               "properties": {"u": {"$ref": "#/$defs/Unit"}}, "required": ["u"]}, "b")
    g = tool_call_grammar([a, b], "<tool_call>", "</tool_call>", parallel=False, lazy=False)

    def call(fn: str, unit: str) -> str:
        return f'<tool_call>\n{{"name": "{fn}", "arguments": {{"u": "{unit}"}}}}\n</tool_call>'

    assert checker.accepts(g, call("a", "c")) and checker.accepts(g, call("b", "mi"))
    assert not checker.accepts(g, call("a", "km")) and not checker.accepts(g, call("b", "f"))


@pytest.mark.model
def test_xml_values_follow_their_pattern_and_hostile_patterns_stay_bounded(
        checker: GrammarChecker) -> None:
    """A string parameter's anchored ``pattern`` in Qwen3.5's XML calls: its text matches
    (unquoted), and the fuzz's worst patterns as such values either build a grammar that
    llama.cpp's parser takes in the engine's checker process, or are a GrammarError."""
    from engine.sampling.grammar_check import GrammarChecker as CheckerProcess
    from engine.sampling.grammar_check import GrammarRefused
    from fuzz_schemas import PATTERN_SHAPES, TRAPS

    def tool(pattern: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"v": {"type": "string", "pattern": pattern}},
            "required": ["v"]}}}

    def xml(pattern: str) -> Grammar:
        return xml_tool_call_grammar([tool(pattern)], "<tool_call>", "</tool_call>",
                                     parallel=False, lazy=False)

    def call(value: str) -> str:
        return f"<tool_call>\n<function=f>\n<parameter=v>\n{value}\n</parameter>\n" \
               "</function>\n</tool_call>"

    code = xml("^[A-Z]{3}-[0-9]{2}$")
    assert checker.accepts(code, call("ABC-12"))
    assert not checker.accepts(code, call("abc-12")) and not checker.accepts(code, call("ABC-1"))
    process = CheckerProcess(require_model("qwen-0.5b"))
    built = refused = 0
    try:
        for pattern in [s.format(n=n) for s in PATTERN_SHAPES
                        for n in ("1000", "1001", "300000", "999999999999999999999")] + TRAPS:
            try:
                grammar = xml(pattern)
            except GrammarError:
                refused += 1
                continue
            try:
                process.check(grammar.text)
                built += 1
            except GrammarRefused:
                refused += 1
    finally:
        process.close()
    assert built >= 20 and refused >= 3, (built, refused)


# -- any schema a client can send: a grammar or a GrammarError, never anything else ----
def _schemas() -> Any:
    from hypothesis import strategies as st

    names = st.sampled_from(["a", "b", "$defs", "definitions", "x-y", "title", "0"])
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=4),
                        st.sampled_from(["string", "object", "array", "integer", "null", "#",
                                         "#/$defs/a", "#/definitions/b", "#/properties/a",
                                         "#/x", "http://h/s", "^a$", "a+"]))
    keys = st.sampled_from(["type", "properties", "items", "$ref", "$defs", "definitions",
                            "anyOf", "oneOf", "allOf", "enum", "const", "required",
                            "additionalProperties", "prefixItems", "pattern", "nullable",
                            "minItems", "maxItems", "format", "not", "title", "strict"])
    return st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                st.dictionaries(st.one_of(keys, names), inner, max_size=4)),
        max_leaves=25)


def test_any_schema_compiles_or_is_a_grammar_error() -> None:
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=int(os.environ.get("SCHEMA_FUZZ", "400")), deadline=None,
              derandomize="SCHEMA_FUZZ" not in os.environ,
              suppress_health_check=list(HealthCheck))
    @given(_schemas())
    def check(schema: Any) -> None:
        for build in (lambda: json_grammar(schema),
                      lambda: tool_call_grammar([_tool(schema), _tool(schema, "b")],
                                                "<tool_call>", "</tool_call>", parallel=True,
                                                lazy=True),
                      lambda: xml_tool_call_grammar([_tool(schema)], "<tool_call>",
                                                    "</tool_call>", parallel=False,
                                                    lazy=False),
                      lambda: bare_call_grammar([_tool(schema)])):
            try:
                grammar = build()
            except GrammarError:
                continue
            assert "root ::=" in grammar.text

    check()


def test_a_grammar_error_says_whether_a_tool_caused_it() -> None:
    bad = {"properties": {"a": {"$ref": "#/nowhere"}}}
    with pytest.raises(GrammarError) as tool_err:
        tool_call_grammar([{"type": "function", "function": {
            "name": "f", "parameters": bad, "strict": True}}], "<a>", "</a>", parallel=False,
            lazy=False)
    assert tool_err.value.tools
    with pytest.raises(GrammarError) as fmt_err:
        json_grammar(bad)
    assert not fmt_err.value.tools


# -- bounds: what would make llama.cpp's grammar blow up is relaxed or refused ----------
@pytest.mark.parametrize("pattern, relaxed", [
    ("^a{1,300000}$", "^a+$"),
    ("^a{0,524288}$", "^a*$"),
    ("^a{5,524288}$", "^a{5,}$"),
    ("^a{300000}$", "^a+$"),
    ("^a{300000,}$", "^a+$"),
    ("^(ab{2,99999}){1,1000}$", "^(ab{2,}){1,1000}$"),
    ("^a{1,1000}$", "^a{1,1000}$"),  # at the limit: kept
    ("^\\{1,99999\\}$", "^\\{1,99999\\}$"),  # escaped braces are text
    ("^[{]{1,99999}$", "^[{]+$"),  # a brace inside a class is text, the count is not
    ("^[\\]{]{2,5}x{1,99999}$", "^[\\]{]{2,5}x+$"),
    ("^a{x}$", "^a{x}$"),  # not a count: left for the converter to refuse
])
def test_large_counts_in_patterns_are_relaxed(pattern: str, relaxed: str) -> None:
    assert relax_pattern(pattern)[0] == relaxed


def test_counts_and_enums_past_the_limits_are_relaxed_and_reported() -> None:
    schemas = SchemaSet()
    out = schemas.add({"type": "object", "properties": {
        "script": {"type": "string", "maxLength": 524288, "minLength": 2},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 5000,
                 "maxItems": REPEAT_LIMIT},
        "pick": {"enum": [f"v{i}" for i in range(ENUM_LIMIT + 1)] + [None]}}},
        "tools.Workflow.parameters")
    props = out["properties"]
    # a string's long maxLength is kept (written in blocks: the next test)
    assert props["script"] == {"type": "string", "minLength": 2, "maxLength": 524288}
    assert props["tags"]["maxItems"] == REPEAT_LIMIT and "minItems" not in props["tags"]
    assert props["pick"] == {"type": ["null", "string"]}
    assert schemas.relaxed == [
        "tools.Workflow.parameters.properties.tags.minItems: 5000 relaxed (unbounded)",
        f"tools.Workflow.parameters.properties.pick.enum: {ENUM_LIMIT + 2} values, relaxed "
        "to their types"]


@settings(max_examples=8, deadline=None)
@given(high=st.sampled_from([1001, 1024, 2083, 4096, 32767]) | st.integers(1001, 20_000),
       low=st.sampled_from([0, 1, 2, 999, 1000]))
def test_a_long_max_length_is_enforced_exactly(checker: GrammarChecker, high: int,
                                               low: int) -> None:
    """``maxLength`` past ``REPEAT_LIMIT`` (Claude Code's 524,288; 1,024 to 65,535 in real
    schemas: strict refused them, not strict dropped them) written as blocks of characters,
    no count above the limit: every length from minLength to maxLength is allowed (the
    block edges too), none past either end."""
    from engine.constraints.schema_converter import long_repetition

    assert all(int(n) <= REPEAT_LIMIT for n in re.findall(r"\d+", long_repetition(
        "c", low, high)))
    for strict in (True, False):
        g = json_grammar({"type": "string", "minLength": low, "maxLength": high},
                         strict=strict)
        assert not g.relaxed
        claude = json_grammar({"type": "string", "maxLength": 524288}, strict=strict)
        sampler = checker.sampler(claude.text)
        assert not claude.relaxed and sampler is not None
        checker.free(sampler)
    n = high - low
    b = -(-n // REPEAT_LIMIT)
    q = n // b
    inside = {low, low + 1, high - 1, high, low + q * b - 1, low + q * b, low + b,
              (low + high) // 2}
    for length in sorted(x for x in inside if low <= x <= high):
        assert checker.accepts(g, json.dumps("ab" * (length // 2) + "c" * (length % 2))), \
            length
    assert not checker.accepts(g, json.dumps("a" * (high + 1)))
    if low:
        assert not checker.accepts(g, json.dumps("a" * (low - 1)))


def test_every_call_markup_writes_a_long_max_length_in_blocks(checker: GrammarChecker) -> None:
    """XML parameters and Gemma 4's strings wrote ``{0,4096}`` themselves, which llama.cpp
    reads as no maximum past 2,000 (a strict bound quietly dropped): now the same blocks
    as JSON strings, no count above the limit, and llama.cpp parses each grammar."""
    from engine.constraints.grammar_gemma4 import gemma4_call_grammar

    tool = _tool({"type": "object", "properties": {"text": {"type": "string",
                                                            "maxLength": 4096}},
                  "required": ["text"]})
    for g in (xml_tool_call_grammar([tool], "<tool_call>", "</tool_call>", parallel=False,
                                    lazy=False),
              gemma4_call_grammar([tool], "<|tool_call>", "<tool_call|>", parallel=False,
                                  lazy=False)):
        assert not g.relaxed
        counts = [int(n) for n in re.findall(r"\{(?:\d+,)?(\d+)\}", g.text)]
        assert counts and max(counts) <= REPEAT_LIMIT, g.text
        sampler = checker.sampler(g.text)
        assert sampler is not None
        checker.free(sampler)


@pytest.mark.parametrize("schema", [
    {"type": "string", "format": "binary", "minLength": 2000, "maxLength": 2000},
    {"type": "string", "minLength": 10**9}, {"type": "string", "minLength": 5000,
                                             "maxLength": 9000}])
def test_a_long_min_length_no_pattern_takes_is_relaxed(schema: dict[str, Any]) -> None:
    """A ``minLength`` past the limit is kept only for a pattern to take it: with an
    annotation-only format (or none) it was a division by zero, or a list of a billion
    rule names built in the server."""
    g = json_grammar(schema)
    assert any("minLength" in r for r in g.relaxed), g.relaxed
    with pytest.raises(GrammarError, match=r"schema\.minLength.*strict"):
        json_grammar(schema, strict=True)


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(400)}},
     "400 optional properties, over the limit of 300"),
    ({"anyOf": [{"type": "integer"}] * (MAX_SCHEMA_NODES + 1)}, "more than 20000 subschemas"),
    ({"const": "x" * (MAX_GRAMMAR_BYTES + 1)}, "bytes, over the limit of 1,048,576"),
    ({"type": "object", "properties": {f"p{i}": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        for i in range(3500)}, "required": [f"p{i}" for i in range(3500)]},
     "rules, over the limit of 10,000"),
])
def test_schemas_past_the_budgets_are_a_grammar_error_naming_the_limit(
        schema: dict[str, Any], words: str) -> None:
    with pytest.raises(GrammarError, match=words):
        json_grammar(schema)


def test_grammar_nesting_past_the_depth_budget_is_refused_before_any_parser() -> None:
    deep = 'root ::= "x" ' + "(" * (MAX_GRAMMAR_DEPTH + 1) + '"a"' + ")?" * (
        MAX_GRAMMAR_DEPTH + 1)
    with pytest.raises(GrammarError, match="nest 1,101 groups deep"):
        bounded(deep)
    # parentheses inside literals and character classes do not count
    assert bounded('root ::= "(((((" [(((] ' + "(" * 10 + '"a"' + ")" * 10)


@pytest.mark.model
def test_a_relaxed_bound_allows_more_and_a_kept_bound_is_still_enforced(
        checker: GrammarChecker) -> None:
    grammar = json_grammar({"type": "object", "properties": {
        "long": {"type": "string", "maxLength": 524288},
        "short": {"type": "string", "maxLength": 3}}, "required": ["long", "short"]})
    assert checker.accepts(grammar, json.dumps({"long": "y" * 2000, "short": "abc"}))
    assert not checker.accepts(grammar, json.dumps({"long": "y", "short": "abcd"}))
    words = json_grammar({"type": "string", "pattern": "^a{1,300000}$"})
    assert checker.accepts(words, json.dumps("a" * 1500))
    assert not checker.accepts(words, json.dumps("ab"))


def test_other_keys_after_an_optional_property_take_their_comma(
        checker: GrammarChecker) -> None:
    """llama-cpp-python's port wrote the keys ``additionalProperties`` allows after the last
    optional property without a comma, and not optional: a JSONSchemaBench answer came back
    as ``{"basic": "..."} "description_json": ...`` with a 200."""
    for extra, v in ((True, "{}"), ({"type": "integer"}, "3")):
        for required in ([], ["a"]):
            g = json_grammar({"type": "object", "required": required,
                              "properties": {"a": {"type": "integer"},
                                             "b": {"type": "integer"}},
                              "additionalProperties": extra})
            for text in ('{"a": 1}', '{"a": 1, "b": 2}', f'{{"a": 1, "b": 2, "zz": {v}}}',
                         f'{{"a": 1, "zz": {v}}}', f'{{"a": 1, "zz": {v}, "yy": {v}}}'):
                assert checker.accepts(g, text), (extra, required, text)
            for text in (f'{{"a": 1 "zz": {v}}}', f'{{"a": 1, "b": 2 "zz": {v}}}', '{"a": 1,}'):
                assert not checker.accepts(g, text), (extra, required, text)


def test_additional_properties_true_takes_any_value(checker: GrammarChecker) -> None:
    """``additionalProperties: true`` beside properties allows any JSON value under another
    key (llama-cpp-python's port wrote it as objects only: every such answer was an object)."""
    for required in ([], ["a"]):
        g = json_grammar({"type": "object", "required": required,
                          "properties": {"a": {"type": "integer"}},
                          "additionalProperties": True})
        for v in ('"text"', "-2.5", "7", "true", "null", "[1, \"x\"]", '{"k": [null]}'):
            assert checker.accepts(g, f'{{"a": 1, "zz": {v}}}'), (required, v)
        assert not checker.accepts(g, '{"a": "one"}')  # its own property keeps its schema


@settings(max_examples=60, deadline=None)
@given(required=st.lists(st.booleans(), min_size=1, max_size=6),
       extra=st.sampled_from([False, True, {"type": "integer"}]), data=st.data())
def test_properties_are_written_in_the_schemas_order(checker: GrammarChecker,
                                                     required: list[bool], extra: Any,
                                                     data: st.DataObject) -> None:
    """Any object's properties in the order its schema lists them, each optional one present
    or not, the other keys after them: every such text is allowed, and a text with two of
    them swapped, a required one left out or another key first is not (the order OpenAI's
    structured outputs write; llama-cpp-python's port put the required properties first)."""
    names = [f"p{i}" for i in range(len(required))]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names},
              "required": [n for n, r in zip(names, required, strict=True) if r],
              "additionalProperties": extra}
    g = json_grammar(schema)
    present = [n for n, r in zip(names, required, strict=True)
               if r or data.draw(st.booleans(), label=n)]
    others = ["zz"] if extra is not False and data.draw(st.booleans(), label="others") else []

    def text(keys: list[str]) -> str:
        return "{" + ", ".join(f'"{k}": {i}' for i, k in enumerate(keys)) + "}"

    assert checker.accepts(g, text(present + others)), text(present + others)
    if len(present) >= 2:
        swapped = [present[1], present[0], *present[2:]]
        assert not checker.accepts(g, text(swapped + others)), text(swapped)
    for i, n in enumerate(present):
        if required[names.index(n)]:
            assert not checker.accepts(g, text(present[:i] + present[i + 1:]))
    if present and extra is not False:
        assert not checker.accepts(g, text(["zz", *present]))


@pytest.mark.parametrize("kind", [["null", "number"], ["number", "string"], "number",
                                  ["number", "integer"], None])
def test_a_whole_multiple_of_one_makes_a_number_of_any_type_list_an_integer(
        checker: GrammarChecker, kind: Any) -> None:
    """``multipleOf: 1`` beside a list of types was dropped, strict or not, with nothing
    recorded: MaskBench's Github_hard o71827 (``"type": ["null", "number"], "multipleOf":
    1.0, "minimum": 0``) allowed ``"stars": 100.5``. With no type at all (dropped there
    too), bounds alone make a number, here an integer."""
    for strict in (True, False):
        schema = {"multipleOf": 1.0, "minimum": 0} if kind is None else \
            {"type": kind, "multipleOf": 1.0, "minimum": 0}
        g = json_grammar(schema, strict=strict)
        assert not g.relaxed
        assert checker.accepts(g, "100") and checker.accepts(g, "0")
        for text in ("100.5", "0.25", "-3", "1e3"):
            assert not checker.accepts(g, text), (kind, text)


@pytest.mark.parametrize("schema", [{"minimum": 1.5}, {"maximum": 3, "exclusiveMinimum": -2},
                                    {"multipleOf": 2, "minimum": 0, "maximum": 10},
                                    {"multipleOf": 0.1, "maximum": 10}])
def test_bounds_without_a_type_make_a_number_within_them(checker: GrammarChecker,
                                                        schema: dict[str, Any]) -> None:
    """``{"minimum": 1}`` (a property's whole schema in real tool definitions) was an
    "Unrecognized schema" error from the converter, strict or not: now the number it means,
    within its bounds, checked against the server's validator (``multipleOf`` in decimals:
    jsonschema's float division calls 0.3 no multiple of 0.1) on either side of them."""
    for strict in (True, False):
        g = json_grammar({"type": "object", "properties": {"n": schema}, "required": ["n"]},
                         strict=strict)
        assert not g.relaxed
        for x in (-3, -2, -1.5, 0, 0.3, 0.5, 0.7, 1, 1.5, 2, 2.5, 3, 3.3, 3.5, 10, 10.5, 11):
            text = json.dumps({"n": x})
            assert checker.accepts(g, text) == (schema_errors(x, schema) is None), \
                (schema, text)
        assert not checker.accepts(g, '{"n": "2"}')


_NUMBER_SHAPES = [({"type": "number"}, "{}"), ({"type": ["number", "null"]}, "{}"),
                  ({"properties": {"x": {"type": "number"}}}, '{{"x": {}}}'),
                  ({"type": "array", "items": {"type": "number"}}, "[{}]"), ({}, "{}")]


# floats of every decimal exponent, most near the point where Python's repr changes form
# (Hypothesis' own floats are mostly huge or tiny); moderate ones with 17 digits
_SCALED = st.builds(lambda m, e: float(f"{m}e{e}"), st.integers(-(10**17), 10**17),
                    st.integers(-30, 8) | st.integers(-330, 300)).filter(math.isfinite)
_NUMBERS = (_SCALED | st.floats(-1e6, 1e6) | st.floats(allow_nan=False, allow_infinity=False)
            | st.integers(-(10**15), 10**15))


@settings(max_examples=80, deadline=None)
@given(x=_NUMBERS, shape=st.sampled_from(_NUMBER_SHAPES))
def test_every_number_json_writes_is_a_number(checker: GrammarChecker, x: float,
                                             shape: tuple[dict[str, Any], str]) -> None:
    """A number as Python's ``json.dumps`` writes it is allowed wherever the schema wants a
    number (alone, a type list, a property, an item, any value): llama-cpp-python's number
    rule read an exponent as an integer part, with no leading zero, and refused ``1e-06``
    (0.000001), and its fraction stopped at 16 digits (``0.30000000000000004``). Its ends
    are still JSON's: no leading zero, no bare point or exponent."""
    schema, wrap = shape
    g = json_grammar(schema)
    text = json.dumps(x)
    assert checker.accepts(g, wrap.format(text)), text
    for bad in (text + ".", text + "e", text + "e+", "0" + text.lstrip("-")):
        assert not checker.accepts(g, wrap.format(bad)), bad


def test_properties_of_the_same_bounds_share_their_rules(checker: GrammarChecker) -> None:
    """A 64-bit integer range or a string length is written once however many properties
    repeat it (real schemas repeat them dozens of times: the grammar grew by ~12 KB each),
    and every property keeps its own bounds."""
    big = {"type": "integer", "minimum": 0, "maximum": 9223372036854775807}

    def schema(n: int) -> dict[str, Any]:
        props: dict[str, Any] = {f"n{i}": dict(big) for i in range(n)}
        props |= {f"s{i}": {"type": "string", "maxLength": 40, "description": f"{i}"}
                  for i in range(n)}
        props["short"] = {"type": "string", "minLength": 2, "maxLength": 3}
        return {"type": "object", "properties": props, "required": list(props)}

    one, many = json_grammar(schema(1)), json_grammar(schema(30))
    assert len(many.text) < 3 * len(one.text), (len(one.text), len(many.text))
    ok = {"n0": 9223372036854775807, "n1": 0, "s0": "x" * 40, "s1": "", "short": "ab"}
    g = json_grammar({**schema(2), "required": list(ok)})
    assert checker.accepts(g, json.dumps(ok))
    for bad in ({"n1": -1}, {"n0": 9223372036854775808}, {"s1": "x" * 41}, {"short": "a"},
                {"short": "abcd"}):
        assert not checker.accepts(g, json.dumps({**ok, **bad})), bad


class Hung(BaseException):
    pass


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=PATTERN_ALPHABET, max_size=14))
def test_any_pattern_text_converts_or_is_refused_at_once(pattern: str) -> None:
    """Every pattern the converter is handed ends: a grammar or a GrammarError. The port's
    reader looped forever on a stray ``]`` or ``}`` (a JSONSchemaBench schema's
    ``^[[a-z]*[-]?[a-z]*]*$`` held a thread and a core of the server until restart)."""
    def hung(*_: Any) -> None:
        raise Hung(pattern)  # (not an Exception: the converter's handlers must not take it)

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        json_grammar({"type": "string", "pattern": pattern})
    except GrammarError:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_stray_closer_is_the_character_itself(checker: GrammarChecker) -> None:
    g = json_grammar({"type": "string", "pattern": "^[[a-z]*[-]?[a-z]*]*$"})
    assert checker.accepts(g, '"[ab-cd]]"') and checker.accepts(g, '"x"')
    assert not checker.accepts(g, '"x}"')
    h = json_grammar({"type": "string", "pattern": "^a}{1,2}b$"})
    assert checker.accepts(h, '"a}b"') and checker.accepts(h, '"a}}b"')
    assert not checker.accepts(h, '"ab"')
