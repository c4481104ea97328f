"""Strict structured output through the real clients, on the tiny random-weight model at
temperature 1 (only the grammar guides what it writes): every answer that ends normally
validates, the client libraries' own helpers parse it, a named tool gives one call, what
strict mode cannot enforce is a 400 naming the keyword, and a non-strict answer that breaks
its schema is counted."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import anthropic
import httpx
import openai
import pytest
from ollama import Client as OllamaClient
from openai import OpenAI
from pydantic import AnyUrl, BaseModel, Field, HttpUrl, UrlConstraints

from api.chat.answer_check import schema_errors
from conftest import ServerProcess

SEEDS = range(4)


class Booking(BaseModel):
    days: Annotated[int, Field(ge=1, le=7)]
    score: Annotated[int, Field(ge=0, le=10)]
    share: Annotated[float, Field(gt=0, lt=1)]
    code: Annotated[str, Field(pattern=r"^[A-Z]{3}-\d{2}$")]
    kind: Literal["hotel", "flat"]
    tags: Annotated[list[Annotated[int, Field(ge=-3, le=3)]], Field(max_length=3)]


@pytest.fixture(scope="module")
def client(tiny_qwen_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=tiny_qwen_server.base_url, api_key="x", max_retries=0, timeout=120)


def test_the_sdk_parse_helper_gets_valid_bounded_objects(client: OpenAI) -> None:
    parsed = 0
    for seed in SEEDS:
        r = client.chat.completions.parse(
            model="x", messages=[{"role": "user", "content": "Book something."}],
            response_format=Booking, temperature=1.0, seed=seed, max_tokens=400)
        choice = r.choices[0]
        if choice.finish_reason == "length":
            continue
        assert choice.message.parsed is not None, choice.message.content
        parsed += 1
    assert parsed >= len(SEEDS) - 1


class Link(BaseModel):
    """Pydantic's URL types write a format beside lengths (``HttpUrl``: ``format: uri``,
    ``minLength: 1``, ``maxLength: 2083``), as a pattern with ``max_length`` does."""

    url: HttpUrl
    home: Annotated[AnyUrl, UrlConstraints(max_length=40)]
    code: Annotated[str, Field(pattern=r"^[A-Z]{2}-\d+$", max_length=8)]


def _strict_format(model: type[BaseModel]) -> dict[str, Any]:
    schema = {**model.model_json_schema(), "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                   "schema": schema}}


def test_a_format_or_a_pattern_beside_lengths_is_served_strict(client: OpenAI) -> None:
    """Strict refused these with a 400 ("a length beside a pattern"; 2,083 past the count
    limit). The lengths are written into the pattern now: every answer that ends validates
    against the schema, formats checked by jsonschema's checkers. (The random model fills a
    string to its end, so the 2,083 characters are served but seldom end here: the
    short fields are the ones judged.)"""

    class Short(BaseModel):
        home: Annotated[AnyUrl, UrlConstraints(max_length=40)]
        code: Annotated[str, Field(pattern=r"^[A-Z]{2}-\d+$", max_length=8)]

    r = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "A link."}], max_tokens=4,
        response_format=_strict_format(Link))  # type: ignore[arg-type]
    assert r.choices[0].finish_reason in ("length", "stop")
    ended = 0
    for seed in SEEDS:
        fmt = _strict_format(Short)
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "A link."}], temperature=1.0,
            seed=seed, max_tokens=600, response_format=fmt)  # type: ignore[arg-type]
        choice = r.choices[0]
        if choice.finish_reason == "length":
            continue
        value = json.loads(choice.message.content or "")
        schema = fmt["json_schema"]["schema"]
        assert schema_errors(value, schema) is None, (value, schema_errors(value, schema))
        assert len(value["code"]) <= 8 and 1 <= len(value["home"]) <= 40
        ended += 1
    assert ended >= 1


def test_a_strict_tool_named_by_tool_choice_gives_one_valid_call(client: OpenAI) -> None:
    tool = openai.pydantic_function_tool(Booking, name="book")
    other = {"type": "function", "function": {"name": "noop", "parameters": {
        "type": "object", "properties": {}}}}
    for seed in SEEDS:
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Book."}], tools=[tool, other],
            tool_choice={"type": "function", "function": {"name": "book"}},
            temperature=1.0, seed=seed, max_tokens=400)
        choice = r.choices[0]
        if choice.finish_reason == "length":
            continue
        calls = choice.message.tool_calls or []
        assert len(calls) == 1 and choice.finish_reason == "tool_calls"
        fn = calls[0].function  # type: ignore[union-attr]
        assert fn.name == "book"
        Booking.model_validate_json(fn.arguments)


AREA = {"type": "object", "required": ["shape"], "properties": {
    "shape": {"type": "string", "enum": ["circle", "rectangle", "triangle"]},
    "radius": {"type": "number"}, "length": {"type": "number"}, "width": {"type": "number"},
    "base": {"type": "number"}, "height": {"type": "number"}},
    "oneOf": [{"properties": {"shape": {"const": "circle"}}, "required": ["radius"]},
              {"properties": {"shape": {"const": "rectangle"}}, "required": ["length", "width"]},
              {"properties": {"shape": {"const": "triangle"}}, "required": ["base", "height"]}]}


def test_a_strict_tool_with_overlapping_one_of_branches_is_served(client: OpenAI) -> None:
    """Glaive's ``calculate_area`` (a JSONSchemaBench schema): its branches overlap (a value
    with every dimension matches each shape's ``required``), which strict answered with a
    400. Each branch is now written apart from the others, and a listed ``shape`` beside a
    ``not`` is checked value by value: every call validates."""
    tool = {"type": "function", "function": {"name": "area", "strict": True,
                                             "parameters": AREA}}
    shapes = set()
    for seed in range(6):
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Area?"}], tools=[tool],
            tool_choice={"type": "function", "function": {"name": "area"}},
            temperature=1.0, seed=seed, max_tokens=200)
        choice = r.choices[0]
        if choice.finish_reason == "length":
            continue
        (call,) = choice.message.tool_calls or []
        args = json.loads(call.function.arguments)  # type: ignore[union-attr]
        assert schema_errors(args, AREA) is None, args
        shapes.add(args["shape"])
    assert shapes, "no call ended"
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "enum": ["red", "green", "blue", 3], "not": {"enum": ["green", 3]}}}}
    for seed in range(3):
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "A color."}], response_format=fmt,
            temperature=1.0, seed=seed, max_tokens=20)
        assert json.loads(r.choices[0].message.content or "") in ("red", "blue")


def test_anthropic_strict_tools_and_output_format(tiny_qwen_server: ServerProcess) -> None:
    schema = Booking.model_json_schema()
    c = anthropic.Anthropic(base_url=tiny_qwen_server.url, api_key="x", max_retries=0)
    for seed in SEEDS[:2]:
        r = c.messages.create(
            model="x", max_tokens=400, messages=[{"role": "user", "content": "Book."}],
            tools=[{"name": "book", "input_schema": schema, "strict": True}],
            tool_choice={"type": "tool", "name": "book"},
            extra_body={"seed": seed, "temperature": 1.0})
        if r.stop_reason == "max_tokens":
            continue
        (use,) = [b for b in r.content if b.type == "tool_use"]
        assert schema_errors(use.input, schema) is None
    r = c.messages.create(model="x", max_tokens=400, messages=[
        {"role": "user", "content": "Book."}], extra_body={"temperature": 1.0,
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    if r.stop_reason != "max_tokens":
        text = "".join(b.text for b in r.content if b.type == "text")
        Booking.model_validate_json(text)


@pytest.mark.parametrize(("where", "schema", "keyword"), [
    ("response_format", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
     "schema.uniqueItems"),
    ("response_format", {"type": "object", "properties": {"a": {"type": "integer"}},
                         "if": {"required": ["a"]}, "then": {"required": ["b"]}},
     "schema.if"),
    ("tools", {"type": "object", "properties": {"s": {"type": "string",
                                                      "pattern": "^(?=a)b$"}}},
     "parameters.properties.s.pattern"),
])
def test_what_strict_cannot_enforce_is_a_400_naming_it(
        client: OpenAI, where: str, schema: dict[str, Any], keyword: str) -> None:
    extra: dict[str, Any]
    if where == "tools":
        extra = {"tools": [{"type": "function", "function": {
            "name": "f", "strict": True, "parameters": schema}}], "tool_choice": "required"}
    else:
        extra = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "strict": True, "schema": schema}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=8, **extra)
    body = err.value.body
    assert isinstance(body, dict) and keyword in body["message"] and "strict" in body["message"]
    assert body["param"] in ("response_format", "tools"), body
    # without strict the same request is served (the keyword relaxed)
    if where == "tools":
        extra["tools"][0]["function"]["strict"] = False
    else:
        extra["response_format"]["json_schema"]["strict"] = False
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=8, **extra)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_a_loose_answer_that_breaks_its_schema_is_counted(
        client: OpenAI, tiny_qwen_server: ServerProcess) -> None:
    """``uniqueItems`` without strict is relaxed: the answers that repeat an item are
    exactly what the server counts as mismatches."""
    schema = {"type": "array", "items": {"enum": [1, 2]}, "minItems": 2, "maxItems": 4,
              "uniqueItems": True}
    key = 'llamaserve_schema_mismatches_total{kind=format,strict=false}'
    before = tiny_qwen_server.metrics().get(key, 0.0)
    broken = ended = 0
    for seed in range(8):
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "x"}], temperature=1.0,
            seed=seed, max_tokens=40, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": schema}})
        if r.choices[0].finish_reason != "stop":
            continue
        ended += 1
        value = json.loads(r.choices[0].message.content or "")
        broken += schema_errors(value, schema) is not None
    assert ended >= 6 and broken >= 1
    assert tiny_qwen_server.metrics().get(key, 0.0) - before == broken


def test_ollama_format_schema_is_enforced(tiny_qwen_server: ServerProcess) -> None:
    schema = Booking.model_json_schema()
    for seed in SEEDS[:2]:
        r = httpx.post(f"{tiny_qwen_server.url}/api/chat", json={
            "model": "tiny-qwen", "stream": False, "format": schema,
            "messages": [{"role": "user", "content": "Book."}],
            "options": {"temperature": 1.0, "seed": seed, "num_predict": 400}}, timeout=120)
        out = r.json()
        if out["done_reason"] == "length":
            continue
        Booking.model_validate_json(out["message"]["content"])


class Note(BaseModel):
    mood: Literal["calm", "busy"] = "calm"  # optional (a default), and listed first
    title: Annotated[str, Field(max_length=12)]
    pages: Annotated[int, Field(ge=1, le=9)] | None = None
    done: bool


def test_properties_come_in_the_schemas_order(tiny_qwen_server: ServerProcess) -> None:
    """An object's properties are written in the order its schema lists them, the
    optional ones too, as OpenAI's structured outputs and llguidance write them; llama.cpp's
    converter put the required ones first, which wrote `mood` after `title` here, and a
    model would answer before the reasoning a schema asks for first. Through Ollama's own
    client, whose documented way is ``format=Model.model_json_schema()`` (a field with a
    default is not required there)."""
    ollama = OllamaClient(host=tiny_qwen_server.url, timeout=120)
    order = list(Note.model_fields)
    opened_with_mood = 0
    for seed in range(6):
        r = ollama.chat(model="tiny-qwen", messages=[{"role": "user", "content": "A note."}],
                        format=Note.model_json_schema(),
                        options={"temperature": 1.0, "seed": seed, "num_predict": 200})
        if r.done_reason == "length":
            continue
        content = r.message.content or ""
        Note.model_validate_json(content)
        keys = list(json.loads(content))  # (in the order written)
        assert keys == [k for k in order if k in keys], content
        opened_with_mood += keys[0] == "mood"
    assert opened_with_mood, "no answer wrote the optional first property: order untested"


# -- llama-server's `grammar` field ------------------------------------------------------
def test_a_grammar_constrains_chat_and_completions(client: OpenAI) -> None:
    for seed in SEEDS:
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "yes or no?"}], temperature=1.0,
            seed=seed, max_tokens=8, extra_body={"grammar": 'root ::= "yes" | "no"'})
        assert r.choices[0].message.content in ("yes", "no")
        c = client.completions.create(model="x", prompt="n =", temperature=1.0, seed=seed,
                                      max_tokens=8, extra_body={"grammar": "root ::= [0-9]{3}"})
        assert len(c.choices[0].text) == 3 and c.choices[0].text.isdigit()
    c = client.completions.create(
        model="x", prompt="{", temperature=1.0, max_tokens=200, extra_body={
            "json_schema": {"type": "object", "properties": {"n": {"type": "integer",
                                                               "minimum": 3, "maximum": 9}},
                            "required": ["n"], "additionalProperties": False}})
    if c.choices[0].finish_reason == "stop":
        assert 3 <= json.loads(c.choices[0].text)["n"] <= 9


def test_a_grammar_that_writes_a_call_is_parsed_as_one(client: OpenAI) -> None:
    call = json.dumps('<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n'
                      '</tool_call>')  # a GBNF literal is written as a JSON string
    r = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Weather?"}], max_tokens=60,
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}],
        extra_body={"grammar": f"root ::= {call}"})
    calls = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


@pytest.mark.parametrize("grammar", [
    "root ::= (", "start ::= \"a\"", 'root ::= "a" undefined-rule', "root ::= root \"a\"",
    "(" * 5000 + '"a"' + ")" * 5000, 'root ::= "' + "a" * (1 << 20) + '"', "root ::= [",
    'root ::= "\\x"', 7,
])
def test_a_bad_grammar_is_a_400_and_the_server_goes_on(
        client: OpenAI, tiny_qwen_server: ServerProcess, grammar: Any) -> None:
    for create in (lambda: client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "x"}], max_tokens=4,
            extra_body={"grammar": grammar}),
                   lambda: client.completions.create(model="x", prompt="x", max_tokens=4,
                                                     extra_body={"grammar": grammar})):
        with pytest.raises(openai.BadRequestError) as err:
            create()
        body = err.value.body
        assert isinstance(body, dict) and body["param"] == "grammar", body
    r = client.completions.create(model="x", prompt="x", max_tokens=2)
    assert r.choices[0].finish_reason == "length"
