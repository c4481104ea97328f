"""GBNF grammars that guarantee structured output and tool calls.

JSON Schema -> GBNF goes through llama-cpp-python's converter (pure Python, subclassed in
``engine.constraints.schema_converter``); this module only wraps its rules:
a JSON value for ``response_format``, or tool-call blocks in the model family's
own markup (``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` for
Hermes-style families) for ``tool_choice`` ``required`` / a named function, and
the same rules behind a lazy trigger (the call marker) for ``auto``; or XML-style
blocks (``<function=NAME>`` / ``<parameter=KEY>`` as in Qwen3.5) whose parameter
values are typed by the tool's schema.
Conversion costs milliseconds, so callers run it off the event loop.

Every grammar is bounded before llama.cpp sees it: ``engine.constraints.json_schema`` relaxes counts
and enums that would blow up, and ``bounded`` refuses a grammar past ``MAX_GRAMMAR_BYTES``
of text, ``MAX_GRAMMAR_RULES`` rules or ``MAX_GRAMMAR_DEPTH`` nested parentheses (llama.cpp's
parser recurses once per parenthesis, on the caller's stack).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import llama_cpp.llama_grammar

from engine.constraints.json_schema import SchemaError, SchemaSet
from engine.constraints.lark_rules import CUSTOM_GRAMMAR
from engine.constraints.regex_rules import gbnf_literal
from engine.constraints.schema_converter import GrammarError as GrammarError
from engine.constraints.schema_converter import _class_char as _class_char
from engine.constraints.schema_converter import _converter as _converter
from engine.constraints.schema_converter import counted
from engine.constraints.schema_converter import custom_rule as custom_rule
from engine.constraints.schema_patterns import excluded
from engine.constraints.schema_terms import ENTRY_COUNT, KEY_PATTERN

_G: Any = llama_cpp.llama_grammar  # untyped Python module: used through Any

MAX_GRAMMAR_BYTES = 1 << 20
MAX_GRAMMAR_RULES = 10_000
MAX_GRAMMAR_DEPTH = 1_100  # REPEAT_LIMIT nested optionals, plus the schema around them


def _tools_error(exc: GrammarError) -> GrammarError:
    exc.tools = True
    return exc


@dataclass(frozen=True)
class Grammar:
    text: str
    lazy_patterns: tuple[str, ...] = ()  # empty: constrain from the first token
    relaxed: tuple[str, ...] = ()  # schema bounds left out (engine.constraints.json_schema)
    # call markup with bare text values: by tool name, each declared parameter and whether
    # its value is written as JSON (True) or as bare text (False); () for other grammars
    markup_values: tuple[tuple[str, tuple[tuple[str, bool], ...]], ...] = ()


def bounded(text: str, *, depth: bool = True) -> str:
    """``text`` if llama.cpp can parse it within the budgets, else a GrammarError saying
    which budget it passes (checked on the text, before any parser sees it; ``depth``
    False skips the nesting scan, for a probe whose whole grammar is scanned later)."""
    if len(text) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"the grammar for this schema would be {len(text):,} bytes, over "
                           f"the limit of {MAX_GRAMMAR_BYTES:,}: simplify the schema")
    rules = text.count("::=")
    if rules > MAX_GRAMMAR_RULES:
        raise GrammarError(f"the grammar for this schema would have {rules:,} rules, over "
                           f"the limit of {MAX_GRAMMAR_RULES:,}: simplify the schema")
    deepest = _nesting(text) if depth else 0
    if deepest > MAX_GRAMMAR_DEPTH:
        raise GrammarError(f"the grammar for this schema would nest {deepest:,} groups deep, "
                           f"over the limit of {MAX_GRAMMAR_DEPTH:,}: simplify the schema")
    return text


_LITERALS = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]')
_NOT_PARENS = re.compile(r"[^()]+")
_STEP = {"(": 1, ")": -1}


def _nesting(text: str) -> int:
    """How deep groups nest, parentheses inside "literals" and [classes] left out."""
    parens = _NOT_PARENS.sub("", _LITERALS.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, parens)), default=0)


def _grammar(conv: Any, schemas: SchemaSet | None, lazy: tuple[str, ...] = ()) -> Grammar:
    relaxed = tuple(schemas.relaxed) if schemas is not None else ()
    return Grammar(bounded(strict_strings(str(conv.format_grammar()))), lazy, relaxed)


_CHAR_RULE = r'char ::= [^"\\] |'
_STRICT_CHAR_RULE = r'char ::= [^"\\\x7F\x00-\x1F] |'


_HEX4 = '"u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]'
# a \u escape of anything but a UTF-16 surrogate: each escape is one character (a string's
# length counts as a validator counts it), never a lone surrogate clients refuse
_NO_SURROGATE = '"u" ([0-9a-cA-CefEF] [0-9a-fA-F] | [dD] [0-7]) [0-9a-fA-F] [0-9a-fA-F]'


_PATTERN_ANY = r'[^"\\\x00-\x1F\x7F]'  # a pattern's "." (or an open class) inside a JSON string


def strings_without(text: str, chars: str) -> str:
    """``text`` with ``chars`` left out of JSON strings' unescaped characters: the string
    character (each is still written as its ``\\u`` escape), a pattern's "." and every class
    of "any character but JSON's unsafe ones" (an object's other keys). With the rest
    (listed values escaped, patterns' own classes, ``schema_patterns.excluding``), no
    string in a call's JSON can write markup that closes a value with one of them."""
    text = text.replace(_STRICT_CHAR_RULE, f"{_STRICT_CHAR_RULE[:-3]}{chars}] |", 1)
    return text.replace(_ANY_SAFE_END, f"{chars}{_ANY_SAFE_END}")


_ANY_SAFE_END = _PATTERN_ANY[2:]  # how a class of any character JSON leaves unescaped ends


def strict_strings(text: str) -> str:
    """The converter's JSON string character without the control characters JSON forbids
    unescaped (its rule lets a raw line break into a string: ``json.loads`` and every
    client then refuse the value; llama.cpp's own converter excludes them the same way),
    and without ``\\u`` escapes of surrogates."""
    if text.startswith(_CHAR_RULE):
        text = _STRICT_CHAR_RULE + text[len(_CHAR_RULE):]
    else:
        text = text.replace("\n" + _CHAR_RULE, "\n" + _STRICT_CHAR_RULE)
    at = text.find(_STRICT_CHAR_RULE)
    if at >= 0:
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        text = text[:at] + text[at:end].replace(_HEX4, _NO_SURROGATE) + text[end:]
    return text


_gbnf_literal = gbnf_literal
def _visit(conv: Any, schema: Any, name: str) -> str:
    try:
        # every reference json_schema leaves points into the shared $defs: given to
        # the converter directly (its own resolve_refs walks every dict, and takes a
        # property named "$ref", as Kubernetes' schemas have, for a reference)
        defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
        conv._refs.update({f"#/$defs/{k}": v for k, v in defs.items()})
        return str(conv.visit(schema, name))
    except RecursionError:
        raise GrammarError("cannot build a grammar for this JSON schema: it nests too "
                           "deeply for the grammar converter") from None
    except Exception as exc:  # the converter's own checks are asserts and lookups; a
        # range engine.constraints.json_schema let through as writable, ValueError
        raise GrammarError(f"cannot build a grammar for this JSON schema: {exc}") from None


def _local(schemas: SchemaSet, schema: Any, where: str, strict: bool = False) -> Any:
    try:
        return schemas.add(schema, where, strict)
    except SchemaError as exc:
        raise GrammarError(f"cannot build a grammar for this JSON schema: {exc}") from None


def json_grammar(schema: dict[str, Any] | None, after: str | None = None,
                 strict: bool = False, prefix: str = "") -> Grammar:
    """Any JSON object (``schema`` None) or a value of ``schema``. With ``after`` (the end
    of a reasoning block), the model reasons freely and the JSON follows that marker;
    ``prefix``: markup written first (Functionary 3.2's "all" recipient line).
    ``strict``: the schema is enforced exactly or refused (``engine.constraints.json_schema``)."""
    conv, schemas = _converter(), SchemaSet()
    local = _local(schemas, schema if schema is not None else {"type": "object"}, "schema",
                   strict)
    value = _visit(conv, schemas.root(local), "json-value")
    if after is None:
        conv._add_rule("root", f"{_gbnf_literal(prefix)} {value}" if prefix else value)
        return _grammar(conv, schemas)
    conv._add_rule("root", _after(after, value))
    return _grammar(conv, schemas, (_trigger(after),))


def _after(marker: str, rule: str) -> str:
    """``rule`` once ``marker`` (the end of a reasoning block) and at most a blank line
    have been written (unbounded whitespace would let an unsure model write only that)."""
    return f'{_gbnf_literal(marker)} [ \\t\\n]{{0,3}} {rule}'


def _blocks(conv: Any, schemas: SchemaSet | None, *, parallel: bool, lazy: bool,
            start: str, after: str | None) -> Grammar:
    """The root over ``call-block`` rules: one or several (``parallel``); behind the
    reasoning end ``after`` when the prompt opened a reasoning block (a forced call must
    not start inside the thinking), else lazy on the call marker (``auto``) or not."""
    blocks = '"\\n"? call-block ("\\n" call-block)*' if parallel else '"\\n"? call-block'
    if after is not None:
        conv._add_rule("root", _after(after, f"({blocks})"))
        return _grammar(conv, schemas, (_trigger(after),))
    conv._add_rule("root", blocks)
    return _grammar(conv, schemas, (_trigger(start),) if lazy else ())


def tool_parameters(tools: list[dict[str, Any]]) -> list[Any]:
    """Each tool's parameter schema, compiled alone once to find the ones the grammar
    cannot express (``checked_parameters``)."""
    return [checked_parameters(tool, lambda conv, schemas, local:
                               _visit(conv, schemas.root(local), "probe")) for tool in tools]


def checked_parameters(tool: dict[str, Any],
                       probe: Callable[[Any, SchemaSet, Any], object]) -> Any:
    """The tool's parameter schema after ``probe(converter, schemas, schema)`` compiled it
    alone: one the grammar cannot express is, for a ``strict`` tool, a GrammarError naming
    the tool, for any other "any object" (its calls are returned as the model wrote them)."""
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object"}
    try:
        conv, schemas = _converter(), SchemaSet()
        probe(conv, schemas, _local(schemas, params, "parameters", is_strict(tool)))
        bounded(str(conv.format_grammar()), depth=False)
    except GrammarError as exc:
        if fn.get("strict"):
            raise GrammarError(f"tool {fn['name']!r}: {exc}") from None
        params = {"type": "object"}
    return params


def any_key(local: Any, strict: bool) -> bool:
    """Whether a call's key/value markup may hold parameters of any name and any value
    (written as text): an object open to any key; under ``strict`` not one whose other keys
    have a schema or a pattern (``KEY_PATTERN``): those get none (a subset)."""
    if not isinstance(local, dict) or local.get("additionalProperties") is False:
        return False
    return not strict or ("additionalProperties" not in local and KEY_PATTERN not in local)


_TEXT_KEYWORDS = {"pattern", "minLength", "maxLength", "format", CUSTOM_GRAMMAR, "title",
                  "description"}


def written_as_text(target: Any) -> bool:
    """Whether call markup writes a parameter's value as bare text (which its parser reads
    back as a string): listed values that are all strings, a string schema, or a schema
    that says nothing a string cannot satisfy; anything else is written as JSON."""
    if not isinstance(target, dict):
        return False
    if excluded() and CUSTOM_GRAMMAR in target:  # (JSON leaves what markup closes with out)
        return False
    values = target.get("enum", [target["const"]] if "const" in target else None)
    if values is not None:  # (one holding a character markup closes values with: JSON,
        # which writes it escaped)
        return isinstance(values, list) and all(
            isinstance(v, str) and not set(v) & set(excluded()) for v in values)
    kind = target.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return not set(target) & {"anyOf", "oneOf", "allOf", "$ref"}
    return kind is None and set(target) <= _TEXT_KEYWORDS


def top_object(local: Any, schemas: SchemaSet, strict: bool, where: str) -> Any:
    """A tool's parameters as the object whose parameters call markup writes: a bare
    reference followed. What the markup cannot write by name (a union or listed values at
    the top, another type, keys of a pattern or a schema) is, under ``strict``, a
    ``GrammarError``; otherwise written as any parameters, and recorded."""
    if isinstance(local, dict) and set(local) == {"$ref"}:
        local = schemas.defs.get(str(local["$ref"]).rsplit("/", 1)[-1], local)
    plain = isinstance(local, dict) and local.get("type", "object") == "object" and \
        not set(local) & {"anyOf", "oneOf", "allOf", "$ref", "enum", "const"}
    if strict and (not plain or (local.get(ENTRY_COUNT) or [0])[0]):
        raise GrammarError(f"cannot build a grammar for this JSON schema: {where}: call markup "
                           "writes one object's parameters by name, which strict mode "
                           "cannot hold for a union, listed values, another type or a "
                           "map that needs a key at the top")
    if not plain or (not strict and isinstance(local, dict) and not local.get("properties")
                     and (KEY_PATTERN in local or isinstance(
                         local.get("additionalProperties"), dict))):
        schemas.relaxed.append(f"{where}: parameters of any name and value (call markup)")
    return local


def is_strict(tool: dict[str, Any]) -> bool:
    """Whether a tool asks for its parameters to be enforced exactly."""
    return bool(tool["function"].get("strict"))


def _trigger(marker: str) -> str:
    r"""A lazy-grammar pattern: llama.cpp searches everything generated so far for it after
    every token (``std::regex_search``) and constrains from its group on. Just the marker:
    a pattern that spans the text (``[\s\S]*?(marker[\s\S]*)``) makes each search
    backtrack over the whole answer, and a long answer with tools slowed to 0.15 s a token
    after 300 tokens (growing with the square of its length)."""
    return "(" + re.escape(marker) + ")"


def _call_objects(tools: list[dict[str, Any]]) -> tuple[SchemaSet, Any]:
    """``{"name": <one of tools>, "arguments": <its parameters>}`` with each tool's schema
    localized on its own, so its ``$ref`` s keep pointing into its own definitions."""
    try:
        return _calls(tools)
    except GrammarError as exc:
        raise _tools_error(exc) from None


def _calls(tools: list[dict[str, Any]]) -> tuple[SchemaSet, Any]:
    schemas = SchemaSet()
    calls = []
    for tool, params in zip(tools, tool_parameters(tools), strict=True):
        name = tool["function"]["name"]
        calls.append({"type": "object", "properties": {
            "name": {"const": name},
            "arguments": _local(schemas, params, f"tools.{name}.parameters",
                                is_strict(tool))},
            "required": ["name", "arguments"]})
    return schemas, schemas.root(calls[0] if len(calls) == 1 else {"anyOf": calls})


def bare_call_grammar(tools: list[dict[str, Any]]) -> Grammar:
    """One bare ``{"name": ..., "arguments": ...}`` object (families without call markup)."""
    conv = _converter()
    schemas, calls = _call_objects(tools)
    conv._add_rule("root", _visit(conv, calls, "call"))
    return _grammar(conv, schemas)


def tool_call_grammar(tools: list[dict[str, Any]], start: str, end: str, *,
                      parallel: bool, lazy: bool, after: str | None = None) -> Grammar:
    """Blocks of ``start\\n{"name": <one of tools>, "arguments": <its parameters>}\\nend``;
    ``parallel`` allows several, separated by newlines; ``after``: see ``_blocks``."""
    conv = _converter()
    schemas, calls = _call_objects(tools)
    call = _visit(conv, calls, "call")
    conv._add_rule("call-block", f'{_gbnf_literal(start + chr(10))} {call} '
                                 f'{_gbnf_literal(chr(10) + end)}')
    return _blocks(conv, schemas, parallel=parallel, lazy=lazy, start=start, after=after)


def xml_tool_call_grammar(tools: list[dict[str, Any]], start: str, end: str, *,
                          parallel: bool, lazy: bool, after: str | None = None) -> Grammar:
    try:
        return _xml_grammar(tools, start, end, parallel=parallel, lazy=lazy, after=after)
    except GrammarError as exc:
        raise _tools_error(exc) from None


# text that never holds "\n<" (where Qwen3's "\n</parameter>" starts): a run of line
# breaks is followed by anything but "<" (a single "\n" [^<] let "\n\n<" through)
NOT_NEWLINE_LT = '([^\\n] | "\\n"+ [^<\\n])* "\\n"*'


def raw_pattern(conv: Any, pattern: str, name: str) -> str:
    """The rule of the text an anchored ``pattern`` matches, unquoted (for markup that
    writes strings bare: Qwen3.5's XML values, Gemma 4's quoted-by-token strings). The
    schema passed through ``SchemaSet`` first, so the pattern is anchored and its counts are
    bounded; what the converter still cannot read is a ``GrammarError``."""
    conv._raw_pattern = True
    try:
        return str(conv._visit_pattern(pattern, f"{name}-pattern"))
    except Exception as exc:  # the converter's own checks are asserts
        raise GrammarError(f"cannot build a grammar for pattern {pattern!r}: {exc}") from None
    finally:
        conv._raw_pattern = False


def _xml_string(conv: Any, target: dict[str, Any], name: str, close: str = "") -> str:
    """A parameter's text value in XML call markup (no quotes): one of its ``enum`` /
    ``const`` strings, else the text its anchored ``pattern`` matches, else one line of
    ``minLength``..``maxLength`` characters (``counted``: a long ``maxLength`` in blocks;
    never ``close``'s first character, where the markup closing the
    value starts with one the parser's lazy regex would cut the value at), else any
    text."""
    if isinstance(target.get(CUSTOM_GRAMMAR), dict):
        return custom_rule(conv, target[CUSTOM_GRAMMAR], name, json_mode=False)
    values = target.get("enum", [target["const"]] if "const" in target else None)
    if values and all(isinstance(v, str) for v in values):
        return str(conv._add_rule(name, " | ".join(_gbnf_literal(v) for v in values)))
    pattern = target.get("pattern")
    if isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$"):
        return raw_pattern(conv, pattern, name)
    lo, hi = target.get("minLength", 0), target.get("maxLength")
    if lo or hi is not None:  # one line, so each character counts once
        first = _class_char(close[0]) if close and close[0] != "\n" else ""
        return str(conv._add_rule(name, counted(f"[^\\n{first}]", lo, hi)))
    return "xml-text"


def _xml_grammar(tools: list[dict[str, Any]], start: str, end: str, *,
                 parallel: bool, lazy: bool, after: str | None) -> Grammar:
    """Blocks of ``start\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*
    </function>\nend``: required parameters in order, optional ones may be left out;
    string values are text that cannot hold a newline followed by ``<``, bounded by their
    schema (``_xml_string``); other values are JSON of their schema."""
    conv, schemas = _converter(), SchemaSet()
    conv._add_rule("xml-text", NOT_NEWLINE_LT)
    conv._add_rule("xml-any-parameter", '"<parameter=" [A-Za-z0-9_.-]+ ">\\n" xml-text '
                                        '"\\n</parameter>\\n"')
    alternatives, written = [], []
    for i, (tool, params) in enumerate(zip(tools, tool_parameters(tools), strict=True)):
        fn = tool["function"]
        where = f"tools.{fn['name']}.parameters"
        local = top_object(_local(schemas, params, where, is_strict(tool)), schemas,
                           is_strict(tool), where)
        required = set(local.get("required", [])) if isinstance(local, dict) else set()
        parts, as_json = [], {}
        props = local.get("properties") if isinstance(local, dict) else None
        for j, (key, spec) in enumerate((props or {}).items()):
            target = spec
            if "$ref" in spec:
                target = schemas.defs.get(spec["$ref"].rsplit("/", 1)[-1], {})
            as_json[key] = not written_as_text(target)
            value = _visit(conv, schemas.root(spec), f"fn{i}-p{j}-value") \
                if as_json[key] else _xml_string(conv, target, f"fn{i}-p{j}-value")
            rule = conv._add_rule(f"fn{i}-p{j}", f'{_gbnf_literal(f"<parameter={key}>" + chr(10))} '
                                  f'{value} {_gbnf_literal(chr(10) + "</parameter>" + chr(10))}')
            parts.append(rule if key in required else f"{rule}?")
        if not props and any_key(local, is_strict(tool)):
            parts.append("xml-any-parameter*")  # any object: parameters of any name
        written.append((fn["name"], tuple(as_json.items())))
        head = _gbnf_literal(f"<function={fn['name']}>" + chr(10))
        alternatives.append(conv._add_rule(f"fn{i}", " ".join(
            [head, *parts, _gbnf_literal("</function>")])))
    conv._add_rule("call", " | ".join(alternatives))
    conv._add_rule("call-block", f'{_gbnf_literal(start + chr(10))} call '
                                 f'{_gbnf_literal(chr(10) + end)}')
    return replace(_blocks(conv, schemas, parallel=parallel, lazy=lazy, start=start,
                           after=after), markup_values=tuple(written))


HARMONY_TEXT = '([^<] | "<" [^|])*'  # a final answer: any text but a harmony token


def harmony_grammar(tools: list[dict[str, Any]], *, forced: bool,
                    schema: dict[str, Any] | None, json_mode: bool,
                    after: str | None, strict: bool = False) -> Grammar:
    """gpt-oss's answer after its analysis channel (``after``, the end of that channel:
    the grammar is lazy on it; None: the prompt ends with ``<|start|>assistant``): a
    ``commentary`` message calling one of ``tools`` with JSON arguments of its parameters,
    or (not ``forced``) a ``final`` message holding a JSON value of ``schema`` (``json_mode``)
    or any text. One call per answer: ``<|call|>`` ends generation."""
    conv, schemas = _converter(), SchemaSet()
    answers = []
    if tools:
        try:
            calls = []
            for i, (tool, params) in enumerate(zip(tools, tool_parameters(tools),
                                                   strict=True)):
                name = tool["function"]["name"]
                args = _visit(conv, schemas.root(_local(schemas, params,
                                                        f"tools.{name}.parameters",
                                                        is_strict(tool))),
                              f"fn{i}-args")
                head = f" to=functions.{name} <|constrain|>json<|message|>"
                calls.append(conv._add_rule(f"fn{i}", f"{_gbnf_literal(head)} {args}"))
        except GrammarError as exc:
            raise _tools_error(exc) from None
        answers.append(conv._add_rule("call", f'"<|channel|>commentary" ({" | ".join(calls)})'))
    if not forced:
        if json_mode:
            value = _visit(conv, schemas.root(_local(
                schemas, schema if schema is not None else {"type": "object"}, "schema",
                strict)), "json-value")
        else:
            value = conv._add_rule("final-text", HARMONY_TEXT)
        answers.append(conv._add_rule("final", f'"<|channel|>final<|message|>" {value}'))
    body = " | ".join(answers)
    if after is None:
        conv._add_rule("root", body)
        return _grammar(conv, schemas)
    conv._add_rule("root", f'{_gbnf_literal(after + "<|start|>assistant")} ({body})')
    return _grammar(conv, schemas, (_trigger(after),))
