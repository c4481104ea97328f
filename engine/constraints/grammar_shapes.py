"""Tool calls in a model family's own markup, as a grammar: the literal pieces a
``parsers.call_shape.CallShape`` names around each call's name and its arguments (JSON of
the tool's parameters, or key/value markup whose string values are written bare).

    section_open call (separator call)* section_close
    call ::= call_open NAME name_close ARGS call_close
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from engine.constraints.grammar import (
    NOT_NEWLINE_LT,
    Grammar,
    GrammarError,
    _after,
    _class_char,
    _converter,
    _gbnf_literal,
    _grammar,
    _local,
    _tools_error,
    _trigger,
    _visit,
    _xml_string,
    any_key,
    is_strict,
    strings_without,
    tool_parameters,
    top_object,
    written_as_text,
)
from engine.constraints.json_schema import SchemaSet
from engine.constraints.schema_patterns import excluded, excluding


class Shape(Protocol):
    call_open: str
    name_close: str
    call_close: str
    section_open: str
    section_close: str
    separator: str
    key_open: str
    key_close: str
    value_close: str
    json_values: bool
    single: bool

    @property
    def marker(self) -> str: ...

    def typed_key_close(self, kind: str) -> str: ...

    @property
    def json_key_close(self) -> str: ...

    def close_value(self, key: str) -> str: ...

    @property
    def pairs(self) -> bool: ...


_JSON_TYPE = {"integer": "number"}  # a schema type as the JSON type of its values


def _listed_type(target: dict[str, Any]) -> str:
    """The JSON type of a typeless schema's listed values, when they share one."""
    values = target.get("enum", [target["const"]] if "const" in target else [])
    kinds = {"null" if v is None else "boolean" if isinstance(v, bool) else "number"
             if isinstance(v, (int, float)) else "string" if isinstance(v, str) else "array"
             if isinstance(v, list) else "object" for v in values}
    return kinds.pop() if len(kinds) == 1 else "string"


def shaped_call_grammar(tools: list[dict[str, Any]], shape: Shape, *, parallel: bool,
                        lazy: bool, after: str | None = None) -> Grammar:
    """One call (or, ``parallel``, several) of ``tools`` in ``shape``. ``lazy``: free text
    until the family's marker, then the calls (``tool_choice: auto``); ``after``: the
    reasoning end the calls follow when the prompt opened a reasoning block."""
    try:
        return _shaped(tools, shape, parallel=parallel, lazy=lazy, after=after)
    except GrammarError as exc:
        raise _tools_error(exc) from None


def _text_rule(value_close: str) -> str:
    """A bare string value: any text that cannot start the markup closing it."""
    if value_close.startswith("\n<"):
        return NOT_NEWLINE_LT
    if value_close.startswith("<"):
        return "[^<]*"
    if len(value_close) > 1 and value_close[0] != "\n":
        # (MiniMax M3's "]<]minimax[>[</key>") the close's first two characters never
        # follow each other inside the value: the parser's lazy regex would cut it there
        # (a run of the first is followed by neither: "]]<" held "]<")
        first, second = (_class_char(c) for c in value_close[:2])
        run = f"{_gbnf_literal(value_close[0])}+"
        return f'([^{first}\\n] | {run} [^{first}{second}\\n])* {_gbnf_literal(value_close[0])}*'
    return "[^\\n]*"


def _shaped(tools: list[dict[str, Any]], shape: Shape, *, parallel: bool, lazy: bool,
            after: str | None) -> Grammar:
    # a value close holding "<" (MiniMax's "</parameter>"): no string a value holds may
    # write it, or the parser's lazy regex would cut the value there (listed values and
    # JSON strings write it escaped, patterns leave it out, bare text never holds it)
    with excluding("<" if shape.pairs and "<" in shape.value_close else ""):
        return _shaped_calls(tools, shape, parallel=parallel, lazy=lazy, after=after)


def _shaped_calls(tools: list[dict[str, Any]], shape: Shape, *, parallel: bool, lazy: bool,
                  after: str | None) -> Grammar:
    conv, schemas = _converter(), SchemaSet()
    if shape.pairs:
        conv._add_rule("xml-text", _text_rule(shape.value_close))
        # a close named after its key ({key}) closes any key here: GBNF has no
        # back-references, and undeclared keys are the open schema's only
        head, _, tail = shape.value_close.partition("{key}")
        any_close = _gbnf_literal(head) + (f" [A-Za-z0-9_.-]+ {_gbnf_literal(tail)}"
                                           if "{key}" in shape.value_close else "")
        conv._add_rule("xml-any-parameter", f"{_gbnf_literal(shape.key_open)} "
                       f"[A-Za-z0-9_.-]+ {_gbnf_literal(shape.key_close)} xml-text "
                       f"{any_close}")
    alternatives, written = [], []
    for i, (tool, params) in enumerate(zip(tools, tool_parameters(tools), strict=True)):
        name = tool["function"]["name"]
        where = f"tools.{name}.parameters"
        local = _local(schemas, params, where, is_strict(tool))
        if shape.pairs:
            local = top_object(local, schemas, is_strict(tool), where)
            args, as_json = _key_values(conv, schemas, shape, local, i, is_strict(tool))
            if not shape.json_values:  # (else every value is JSON, strings quoted)
                written.append((name, as_json))
        else:
            args = _visit(conv, schemas.root(local), f"fn{i}-args")
        before, index, rest = shape.name_close.partition("{index}")
        head = _gbnf_literal(f"{shape.call_open}{name}{before}")
        if index:  # the call's position (Kimi K3): any, GBNF cannot count
            head += f" [1-9] [0-9]? {_gbnf_literal(rest)}" if rest else " [1-9] [0-9]?"
        tail = _gbnf_literal(shape.call_close) if shape.call_close else ""
        alternatives.append(conv._add_rule(f"fn{i}", f"{head} {args} {tail}".strip()))
    conv._add_rule("call", " | ".join(alternatives))
    if shape.single or (not shape.marker and not shape.separator):
        parallel = False  # one call per answer (GigaChat), or a bare JSON call (Llama 3)
    sep = _gbnf_literal(shape.separator) if shape.separator else ""
    calls = f"call ({sep} call)*" if parallel else "call"
    opening = shape.section_open.lstrip()  # leading space: already written before a trigger
    body = " ".join(p for p in (_gbnf_literal(opening) if opening else "", calls,
                                _gbnf_literal(shape.section_close) if shape.section_close
                                else "") if p)
    if shape.section_open != opening:
        body = f'" "? {body}'
    if after is not None:
        conv._add_rule("root", _after(after, f"({body})"))
        grammar = _grammar(conv, schemas, (_trigger(after),))
    else:
        conv._add_rule("root", body)
        grammar = _grammar(conv, schemas,
                           (_trigger(shape.marker),) if lazy and shape.marker else ())
    if excluded():  # the string character and classes of any character, as _shaped says
        grammar = replace(grammar, text=strings_without(grammar.text, excluded()))
    return replace(grammar, markup_values=tuple(written))


def _key_values(conv: Any, schemas: SchemaSet, shape: Shape, local: Any, i: int,
                strict: bool) -> tuple[str, tuple[tuple[str, bool], ...]]:
    """A call's arguments as key/value markup: declared parameters in order (required
    ones always, optional ones may be left out); with no declared parameters and an open
    schema, any. With each declared parameter and whether its value is written as JSON
    (True) or as bare text."""
    parts, as_json = [], {}
    props = local.get("properties") if isinstance(local, dict) else None
    required = set(local.get("required", [])) if isinstance(local, dict) else set()
    for j, (key, spec) in enumerate((props or {}).items()):
        target = spec
        if "$ref" in spec:
            target = schemas.defs.get(spec["$ref"].rsplit("/", 1)[-1], {})
        kind = target.get("type")
        bare = written_as_text(target) and not shape.json_values
        as_json[key] = not bare
        value = _xml_string(conv, target, f"fn{i}-p{j}-value", shape.close_value(key)) \
            if bare else \
            _visit(conv, schemas.root(spec), f"fn{i}-p{j}-value")
        json_type = _JSON_TYPE.get(kind, kind) if isinstance(kind, str) else _listed_type(target)
        close = shape.key_close if bare else shape.typed_key_close(json_type)
        key_text = _gbnf_literal(shape.key_open + key + close)
        rule = conv._add_rule(f"fn{i}-p{j}",
                              f"{key_text} {value} {_gbnf_literal(shape.close_value(key))}")
        parts.append(rule if key in required else f"{rule}?")
    if not props and any_key(local, strict):
        parts.append("xml-any-parameter*")
    return " ".join(parts) or '""', tuple(as_json.items())
