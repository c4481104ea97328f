"""JSON Schemas at their worst, for every route and frame that takes a schema.

Each keyword the schema converter reads (``engine/constraints/json_schema.py``, llama-cpp-python's
converter) gets its worst values: huge and odd counts (``maxLength: 524288``, as Claude
Code sends), huge ``enum`` / ``const`` values, deep and recursive ``$ref`` chains, wide
``anyOf`` / ``oneOf``, patterns with large or nested counted repetitions and backtracking
traps, very long property names, thousands of properties and of tools. ``schema_cases``
puts one of them where a request carries a schema: a chat tool's ``parameters`` or
``response_format``, a Responses tool or ``text.format`` (over HTTP and as a WebSocket
frame), an Anthropic tool's ``input_schema`` or ``output_config.format``; and a Responses
custom tool's Lark or regex grammar at its worst (``custom_grammars``).

Sizes stay under the fuzz server's 64 KiB body limit, so the schema itself is what is
tested, not the body limit.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

COUNT_KEYWORDS = ["minLength", "maxLength", "minItems", "maxItems", "minProperties",
                  "maxProperties", "minimum", "maximum", "exclusiveMinimum",
                  "exclusiveMaximum", "multipleOf", "minContains", "maxContains"]
COUNTS: list[Any] = [0, 1, 2, 999, 1000, 1001, 4096, 65536, 524288, 2**31, 2**53, 10**30,
                     -1, 1.5, 1e308, "10", True, None, [], {}]

REPEATS = ["1", "5", "999", "1000", "1001", "20000", "300000", "999999999999999999999"]
PATTERN_SHAPES = [
    "^a{{{n}}}$", "^a{{1,{n}}}$", "^a{{{n},}}$", "^[a-z]{{{n}}}$", "^(ab|cd){{1,{n}}}$",
    "^(a{{1,{n}}}){{1,{n}}}$", "^((a{{2,{n}}})b{{0,{n}}}){{3,{n}}}$", "^.{{{n}}}$",
    "^[0-9]{{{n}}}-[a-f]{{1,{n}}}$", "^a{{{n},3}}$", "^a{{,{n}}}$", "^\\d{{1,{n}}}$",
    "^\\{{1,{n}\\}}$", "^[{{]{{1,{n}}}$",
]
TRAPS = ["^(a+)+$", "^(a*)*b$", "^((a*)*)*c$", "^(a|aa)+$", "^(.*a){20}$", "^(a|a?)+$",
         "^(\\w+\\s?)*$", "^([a-z]+)*[0-9]$", "^(((((((((((a)))))))))))*$", "^()*$",
         "^(|a)+$", "^[^]*$", "^a**$", "^a{2}{3}{4}$", "^(?:a)$", "^(a$", "^a)$", "^[a$",
         "^a{x}$", "^a{1,2,3}$", "^\\\\$"]

TYPES = ["string", "number", "integer", "boolean", "object", "array", "null"]


def _nested(depth: int, make: Any) -> Any:
    schema: Any = {"type": "string"}
    for _ in range(depth):
        schema = make(schema)
    return schema


@st.composite
def counted(draw: st.DrawFn) -> dict[str, Any]:
    """A type with one or more counts at their worst values."""
    kind = draw(st.sampled_from(["string", "array", "object", "integer", None]))
    schema: dict[str, Any] = {} if kind is None else {"type": kind}
    if kind == "array":
        schema["items"] = draw(st.sampled_from([{"type": "string", "maxLength": 524288},
                                                {"type": "integer"}, {}]))
    for key in draw(st.lists(st.sampled_from(COUNT_KEYWORDS), min_size=1, max_size=3)):
        schema[key] = draw(st.sampled_from(COUNTS))
    return schema


PATTERN_ALPHABET = "[]{}()|.*+?^$\\-a0,"


@st.composite
def patterned(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["shape", "trap", "any"]))
    if kind == "shape":
        pattern = draw(st.sampled_from(PATTERN_SHAPES)).format(n=draw(st.sampled_from(REPEATS)))
    elif kind == "trap":
        pattern = draw(st.sampled_from(TRAPS))
    else:  # any text of regex syntax: stray closers, unbalanced groups, bare quantifiers
        pattern = draw(st.text(alphabet=PATTERN_ALPHABET, max_size=14))
    schema: dict[str, Any] = {"type": "string", "pattern": pattern}
    if draw(st.booleans()):
        schema["maxLength"] = draw(st.sampled_from(COUNTS))
    return schema


@st.composite
def large(draw: st.DrawFn) -> Any:
    """Huge enums and consts, long names, thousands of properties, wide unions."""
    n = draw(st.sampled_from([1000, 1001, 3000]))
    kind = draw(st.sampled_from(["enum", "enum-mixed", "const-long", "const-deep", "long-name",
                                 "properties", "required-properties", "anyOf", "oneOf",
                                 "prefixItems", "types"]))
    if kind == "enum":
        return {"type": "string", "enum": [f"v{i}" for i in range(n)]}
    if kind == "enum-mixed":
        return {"enum": [i if i % 3 else None if i % 2 else f"s{i}" for i in range(n)]}
    if kind == "const-long":
        return {"const": "x" * draw(st.sampled_from([1000, 30000]))}
    if kind == "const-deep":
        value: Any = 1
        for _ in range(draw(st.sampled_from([10, 40]))):
            value = {"k": [value]}
        return {"const": value}
    if kind == "long-name":
        name = draw(st.sampled_from(["n" * 30000, "\\\"" * 5000, "é" * 8000]))
        return {"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}
    if kind in ("properties", "required-properties"):
        props = {f"p{i}": {"type": "integer"} for i in range(n)}
        schema = {"type": "object", "properties": props}
        if kind == "required-properties":
            schema["required"] = list(props)
        return schema
    if kind in ("anyOf", "oneOf"):
        return {kind: [{"const": i} for i in range(n)]}
    if kind == "prefixItems":
        return {"type": "array", "prefixItems": [{"type": "integer"}] * n}
    return {"type": TYPES * 3, "minLength": 524288, "maxItems": 524288}


@st.composite
def referencing(draw: st.DrawFn) -> Any:
    """Deep, recursive, mutually recursive, dangling and remote ``$ref`` s."""
    kind = draw(st.sampled_from(["chain", "self", "mutual", "no-base", "dangling", "remote",
                                 "pointer", "wide-defs", "nested-defs", "ref-siblings"]))
    n = draw(st.sampled_from([10, 500, 1500]))
    if kind == "chain":
        defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
        defs[f"d{n}"] = {"type": "string", "maxLength": 524288}
        return {"$defs": defs, "$ref": "#/$defs/d0"}
    if kind == "self":
        return {"type": "object", "properties": {"next": {"$ref": "#"},
                                                 "v": {"type": "string", "maxLength": 99999}}}
    if kind == "mutual":
        return {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}},
                          "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
                "$ref": "#/$defs/a"}
    if kind == "no-base":
        return {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a"}
    if kind == "dangling":
        return {"$ref": "#/$defs/missing"}
    if kind == "remote":
        return {"$ref": draw(st.sampled_from(["http://127.0.0.1:1/x.json", "file:///etc/passwd",
                                              "other.json#/a", "#/../../x", "#/%00"]))}
    if kind == "pointer":
        return {"properties": {"a": {"type": "string"}}, "$ref": "#/properties/a/" + "x/" * n}
    if kind == "wide-defs":
        defs = {f"d{i}": {"type": "integer", "maximum": i} for i in range(n)}
        return {"$defs": defs, "anyOf": [{"$ref": f"#/$defs/d{i}"} for i in range(n)]}
    if kind == "nested-defs":
        return _nested(min(n, 30), lambda s: {"$defs": {"x": s}, "$ref": "#/$defs/x"})
    return {"$ref": "#", "type": "object", "minItems": 10**30, "properties": {"a": {"$ref": "#"}}}


@st.composite
def nested(draw: st.DrawFn) -> Any:
    """Nesting within the body's depth limit: arrays of arrays, objects of objects."""
    depth = draw(st.sampled_from([5, 20, 40]))
    if draw(st.booleans()):
        return _nested(depth, lambda s: {"type": "array", "items": s, "maxItems": 524288})
    return _nested(depth, lambda s: {"type": "object", "properties": {"a": s},
                                     "required": ["a"], "maxProperties": 10**9})


def schemas() -> st.SearchStrategy[Any]:
    return st.one_of(counted(), patterned(), large(), referencing(), nested())


# custom tools' grammars (engine/constraints/lark_rules.py) at their worst
LARK_SHAPES = [
    'start: "a"~{n}', 'start: ("a"~{n})~{n}', 'start: /a{{{n}}}/', 'start: /(a{{1,{n}}}){{1,{n}}}/',
    'start: x~0..{n}\nx: /[a-z]+/ | "(" start ")"', 'start: A~{n}\nA: "a".."z"',
]
LARK_HOSTILE = [
    "start: start", "start: a\na: start", "start: a\na: b\nb: a \"x\"", "start:",
    "start: \"", "start: /", "start: /(/", "%import common.NOPE\nstart: \"a\"",
    "start: \"a\"\n%ignore start", "%ignore \" \"\nstart: \"a\" \"b\"",
    "start: " + "(" * 3000 + '"a"' + ")" * 3000,
    "start: " + " | ".join(f'"{i}"' for i in range(5000)),
    "\n".join(["start: r0"] + [f"r{i}: r{i + 1} r{i + 1}" for i in range(60)] + ['r60: "a"']),
    "start: \"a\"~1000000", "start: \"\\ud800\"", "start: /[\\ud800-\\udfff]/",
    "start: /\\x00+/", "start: /[^\\x00-\\U0010FFFF]/", "start: \"\"", "start: \"a\"*~5",
    "START: \"a\"", "start: %json {}", "start: <[1]>", "start: \"x\" -> ",
]


@st.composite
def custom_grammars(draw: st.DrawFn) -> dict[str, Any]:
    """A custom tool's ``format``: Lark or regex at its worst, or not a grammar at all."""
    kind = draw(st.sampled_from(["shape", "hostile", "regex", "text", "not a string"]))
    if kind == "shape":
        text = draw(st.sampled_from(LARK_SHAPES)).format(n=draw(st.sampled_from(REPEATS)))
        return {"type": "grammar", "syntax": "lark", "definition": text}
    if kind == "hostile":
        return {"type": "grammar", "syntax": "lark",
                "definition": draw(st.sampled_from(LARK_HOSTILE))}
    if kind == "regex":
        pattern = draw(st.sampled_from(TRAPS + PATTERN_SHAPES))
        return {"type": "grammar", "syntax": "regex", "definition": pattern.format(
            n=draw(st.sampled_from(REPEATS))) if "{n}" in pattern else pattern}
    if kind == "text":
        return {"type": "grammar", "syntax": draw(st.sampled_from(["lark", "regex", "ebnf"])),
                "definition": draw(st.text(max_size=200))}
    return {"type": "grammar", "syntax": "lark",
            "definition": draw(st.sampled_from([None, 5, [], {"a": 1}]))}


ROUTES = ["chat-tool", "chat-format", "chat-custom", "responses-tool", "responses-format",
          "responses-custom",
          "messages-tool",
          "messages-format", "many-tools"]


@st.composite
def schema_cases(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """(path, body) with one hostile schema where that route takes a schema; the body of
    ``/v1/responses`` is also what a WebSocket ``response.create`` frame carries."""
    route = draw(st.sampled_from(ROUTES))
    schema = draw(schemas())
    wrap = draw(st.booleans())  # the schema as a property of an object, or the object itself
    params = {"type": "object", "properties": {"x": schema}, "required": ["x"]} if wrap \
        else schema
    forced = draw(st.booleans())
    if route == "many-tools":
        count = draw(st.sampled_from([200, 1000]))
        tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {
            "type": "object", "properties": {"s": {"type": "string", "maxLength": 524288}}}}}
            for i in range(count)]
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "tools": tools,
            "tool_choice": "required" if forced else "auto", "max_tokens": 2}
    if route == "chat-tool":
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "tools": [{"type": "function", "function": {
                "name": "f", "parameters": params, "strict": draw(st.booleans())}}],
            "tool_choice": "required" if forced else "auto"}
    if route == "chat-format":
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": params}}}
    if route == "responses-tool":
        return "/v1/responses", {
            "input": "Hi", "max_output_tokens": 3,
            "tools": [{"type": "function", "name": "f", "parameters": params}],
            "tool_choice": "required" if forced else "auto"}
    if route == "chat-custom":  # the same grammar, as Chat Completions nests it
        fmt = draw(custom_grammars())
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "tools": [{"type": "custom", "custom": {"name": "c", "format": {
                "type": "grammar", "grammar": {"syntax": fmt["syntax"],
                                               "definition": fmt["definition"]}}}}],
            "tool_choice": {"type": "custom", "custom": {"name": "c"}} if forced else "auto"}
    if route == "responses-custom":
        return "/v1/responses", {
            "input": "Hi", "max_output_tokens": 3,
            "tools": [{"type": "custom", "name": "c", "format": draw(custom_grammars())}],
            "tool_choice": {"type": "custom", "name": "c"} if forced else "auto"}
    if route == "responses-format":
        return "/v1/responses", {
            "input": "Hi", "max_output_tokens": 3,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": params}}}
    if route == "messages-tool":
        return "/v1/messages", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "tools": [{"name": "f", "input_schema": params}],
            "tool_choice": {"type": "any"} if forced else {"type": "auto"}}
    return "/v1/messages", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
        "output_config": {"format": {"type": "json_schema", "schema": params}}}
