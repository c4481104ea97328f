"""llama-cpp-python's JSON Schema converter (``llama_cpp.llama_grammar.SchemaConverter``, pure
Python), and what this project changes in it (``_Converter``):

- a bounded integer or number written as the pattern of its range (``schema_numbers``), and
  each distinct bound (a range, a string length) one rule shared by every property that
  repeats it;
- an object's properties in the order the schema lists them, as OpenAI's structured outputs
  and llguidance write them (the port puts the required ones first: a model was made to
  answer before the reasoning a schema asked for first), and its other keys
  (``additionalProperties``) after them, as strings that are none of its declared names;
- a custom tool's grammar inside a JSON string (``lark_rules``);
- a pattern's stray ``]`` or ``}`` read as the character it is (the port's pattern reader
  loops forever on one: a request's schema held a thread and a core until restart);
- a JSON number as JSON writes it: the port's exponent was an integer part, with no leading
  zero, so ``1e-06`` (how Python writes 0.000001) was refused, and its fraction stopped at
  16 digits, so ``0.30000000000000004`` (Python's 0.1 + 0.2) was too (``NUMBER``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import llama_cpp.llama_grammar

from engine.constraints.lark_rules import (
    CUSTOM_GRAMMAR,
    GrammarSyntaxError,
    add_rules,
    parse_custom,
)
from engine.constraints.regex_rules import class_char, gbnf_literal
from engine.constraints.schema_numbers import number_bounds
from engine.constraints.schema_patterns import (
    JSON_UNSAFE,
    REPEAT_LIMIT,
    escape_excluded,
    excluded,
)
from engine.constraints.schema_terms import DISTINCT, ENTRY_COUNT, KEY_PATTERN

_G: Any = llama_cpp.llama_grammar  # untyped Python module: used through Any
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone one: JSON's escape (no UTF-8 has it)


class GrammarError(ValueError):
    """A schema the converter cannot turn into a grammar (a 400 for the request);
    ``tools`` tells whether a tool's parameters were the cause (else the response format)."""

    tools = False


_gbnf_literal = gbnf_literal
# every float Python's repr writes: up to 16 integer digits (repr switches to an exponent at
# 1e16), a fraction of up to 3 zeros and 17 significant digits, an exponent's digits with
# leading zeros as JSON allows them (1e-06)
NUMBER = _G.BuiltinRule('("-"? integral-part) ("." fraction-part)? ([eE] [-+]? exponent-part)? '
                        "space", ["integral-part", "fraction-part", "exponent-part"])
_NUMBER_PARTS = {"fraction-part": _G.BuiltinRule("[0-9]{1,21}", []),
                 "exponent-part": _G.BuiltinRule("[0-9]{1,16}", [])}
_PLAIN_STRING = {"type", "minLength", "maxLength", "description", "title", "examples",
                 "default", "$comment"}


def stray_closers_as_classes(pattern: str) -> str:
    """``pattern`` with each ``]`` or ``}`` that closes nothing as a class of itself: a
    regular expression reads one as itself, and the port's pattern reader (which takes a
    class up to its first ``]`` and a count up to its first ``}``, as this scan does) never
    moves past it."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c in "[{":
            close = "]" if c == "[" else "}"
            j = i + 1
            while j < n and pattern[j] != close:
                j += 2 if pattern[j] == "\\" and c == "[" else 1
            out.append(pattern[i:j + 1])
            i = j + 1
            continue
        # a class of one: a quantifier after it takes it alone (an escape would join
        # the literal before it)
        out.append({"]": "[\\]]", "}": "[}]"}.get(c, c))
        i += 1
    return "".join(out)


class _Converter(_G.SchemaConverter):  # type: ignore[misc]
    """llama-cpp-python's converter with the changes the module's docstring lists."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shared_rules: dict[tuple[Any, ...], str] = {}  # a bound's key: its rule
        self._key_pattern: str | None = None  # the next object's other keys (KEY_PATTERN)
        self._entry_count: list[Any] | None = None  # and how many it holds (ENTRY_COUNT)

    def _format_literal(self, literal: str) -> str:
        # the port escapes quotes and line breaks but not a backslash, so a listed value
        # holding a quote or a backslash (JSON writes them \" and \\) made a grammar
        # llama.cpp cannot parse, and one holding a line break (\n) a grammar that wrote
        # it raw into the string (not JSON); non-ASCII is written as it is
        return str(super()._format_literal(literal.replace("\\", "\\\\")))

    def _generate_constant_rule(self, value: Any) -> str:
        text = json.dumps(value, ensure_ascii=False)
        text = _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)
        return self._format_literal(escape_excluded(text))

    def visit(self, schema: Any, name: str) -> Any:
        if isinstance(schema, dict) and (KEY_PATTERN in schema or ENTRY_COUNT in schema):
            # a map's keys and their count: read by the _build_object_rule the port calls
            # first for this object (reset after, whatever path the visit took)
            keys = schema.get(KEY_PATTERN)
            self._key_pattern = None if keys is None else str(keys)
            self._entry_count = schema.get(ENTRY_COUNT)
            try:
                return self.visit({k: v for k, v in schema.items()
                                   if k not in (KEY_PATTERN, ENTRY_COUNT)}, name)
            finally:
                self._key_pattern = self._entry_count = None
        if isinstance(schema, dict) and DISTINCT in schema:  # (schema_keywords._distinct)
            rule = f"{name}-" if name in _G.RESERVED_NAMES else name or "root"
            values, low = schema[DISTINCT]
            body = distinct([self._generate_constant_rule(v) for v in values], low,
                            self._add_rule, f"{rule}-distinct", '"," space')
            return self._add_rule(rule, f'"[" space {body} "]" space')
        if isinstance(schema, dict) and isinstance(schema.get(CUSTOM_GRAMMAR), dict):
            rule = f"{name}-" if name in _G.RESERVED_NAMES else name or "root"
            inner = custom_rule(self, schema[CUSTOM_GRAMMAR], rule, json_mode=True)
            return self._add_rule(rule, f'"\\"" {inner} "\\"" space')
        if isinstance(schema, dict) and "$ref" not in schema and "anyOf" not in schema \
                and "oneOf" not in schema:
            pattern = number_bounds(schema)
            if pattern is not None:
                rule = f"{name}-" if name in _G.RESERVED_NAMES else name or "root"
                value = self._shared(("number", pattern),
                                     lambda: self._number_pattern(pattern, f"{rule}-number"))
                return self._add_rule(rule, f"{value} space")
            if schema.get("type") == "string" and set(schema) <= _PLAIN_STRING and \
                    ("minLength" in schema or "maxLength" in schema):
                rule = f"{name}-" if name in _G.RESERVED_NAMES else name or "root"
                low, high = schema.get("minLength", 0), schema.get("maxLength")
                if high is not None and high > REPEAT_LIMIT:
                    return self._add_rule(rule, self._shared(
                        ("string", low, high), lambda: self._long_string(low, high)))
                return self._add_rule(rule, self._shared(("string", low, high), lambda: str(
                    super(_Converter, self).visit(
                        {"type": "string", "minLength": low, "maxLength": high},
                        f"string-{low}-{high}"))))
        return super().visit(schema, name)

    def _long_string(self, low: int, high: int) -> str:
        """A string of ``low`` to ``high`` characters, ``high`` past ``REPEAT_LIMIT``
        (``long_repetition``)."""
        char = self._add_primitive("char", _G.PRIMITIVE_RULES["char"])
        return str(self._add_rule(f"string-{low}-{high}",
                                  f'"\\"" {long_repetition(char, low, high)} "\\"" space'))

    def _visit_pattern(self, pattern: str, name: str) -> Any:
        return super()._visit_pattern(stray_closers_as_classes(pattern), name)

    def _add_primitive(self, name: str, rule: Any) -> Any:
        """The port's primitives, with JSON's own number (``NUMBER``) for its number."""
        if rule is _G.PRIMITIVE_RULES["number"]:
            rule = NUMBER
        if name in _NUMBER_PARTS:  # (the port looks a dependency up in its own table)
            rule = _NUMBER_PARTS[name]
        n = self._add_rule(name, rule.content)
        for dep in rule.deps:
            if dep not in self._rules:
                self._add_primitive(dep, _NUMBER_PARTS.get(dep) or _G.PRIMITIVE_RULES.get(dep)
                                    or _G.STRING_FORMAT_RULES[dep])
        return n

    def _shared(self, key: tuple[Any, ...], make: Any) -> str:
        """One rule for every schema of the same bounds: a 64-bit integer range is ~12 KB of
        rules and a string of at most 1,024 characters ~8 KB, and real schemas repeat them
        over dozens of properties (a Snowplow schema's grammar: 308 KB -> 22 KB)."""
        if key not in self._shared_rules:
            self._shared_rules[key] = make()
        return self._shared_rules[key]

    def _number_pattern(self, pattern: str, name: str) -> str:
        self._raw_pattern = True
        try:
            return str(self._visit_pattern(pattern, name))
        finally:
            self._raw_pattern = False

    def _build_object_rule(self, properties: list[tuple[str, Any]], required: set[str],
                           name: str, additional_properties: Any) -> str:
        """An object's properties in the schema's order (``ordered_members``), then its
        other keys (``additional_properties`` True or a schema) in any number."""
        prefix = f"{name}{'-' if name else ''}"
        keys, self._key_pattern = self._key_pattern, None  # this object's only
        count, self._entry_count = self._entry_count, None
        kvs = []
        for prop, schema in properties:
            value = self.visit(schema, f"{prefix}{prop}")
            kvs.append((f"{prefix}{prop}", self._add_rule(
                f"{prefix}{prop}-kv",
                f'{self._generate_constant_rule(prop)} space ":" space {value}'),
                prop in required))
        other = None
        if additional_properties == True or isinstance(additional_properties, dict):  # noqa: E712
            value = self.visit({} if additional_properties == True else additional_properties,  # noqa: E712
                               f"{prefix}additional-value")
            if keys is not None and not properties:
                key = str(self._visit_pattern(keys, f"{prefix}additional-kv-key"))
            elif properties:
                key = self._other_names([k for k, _ in properties], f"{prefix}additional-kv-key")
            else:
                key = self._add_primitive("string", _G.PRIMITIVE_RULES["string"])
            other = (f"{prefix}additional",
                     self._add_rule(f"{prefix}additional-kv", f'{key} ":" space {value}'))
        if count is not None and other is None and not properties:  # no key may stand
            if count[0]:
                raise GrammarError("an object that needs a key where no key is allowed")
            return '"{" space "}" space'
        if count is not None:  # a map's count of entries (nothing else sets it)
            if properties or other is None:
                raise GrammarError("a count of entries beside declared properties")
            body = entries(other[1], self._add_rule(f"{prefix}additional-more",
                                                    f'"," space {other[1]}'), *count)
            return f'"{{" space {body} "}}" space'
        first = ordered_members(kvs, self._add_rule, '"," space', other)
        return f'"{{" space {first} "}}" space' if first else '"{" space "}" space'

    def _other_names(self, names: list[str], rule: str) -> str:
        """A rule for JSON strings written without escapes that are none of ``names``."""
        trie: dict[str, Any] = {}
        for n in names:
            node = trie
            for c in n:
                node = node.setdefault(c, {})
            node[""] = {}  # a name ends here
        free = self._add_rule("other-name-char", f"[^{JSON_UNSAFE}]")
        counter = iter(range(1 << 30))

        def walk(node: dict[str, Any]) -> str:
            chars = [c for c in node if c]
            alts = []
            if chars:
                listed = "".join(_class_char(c) for c in chars)
                alts.append(f"[^{listed}{JSON_UNSAFE}] {free}*")
            else:
                alts.append(f"{free}+")
            for c in chars:
                if c not in excluded():  # (another name may not hold it raw: call markup)
                    alts.append(f"{_gbnf_literal(c)} {walk(node[c])}")
            if "" not in node:
                alts.append('""')  # the key may end here: no name ends here
            return str(self._add_rule(f"{rule}-{next(counter)}", " | ".join(alts)))

        return str(self._add_rule(rule, f'"\\"" {walk(trie)} "\\"" space'))


def ordered_members(members: list[tuple[str, str, bool]], add_rule: Callable[[str, str], str],
                    comma: str, other: tuple[str, str] | None = None) -> str:
    """The rule (its name; "" when the object may only be empty) of an object's members in
    the order given, each required one present, each optional one present or not, with
    ``comma`` between them; ``members``: (the stem of its rules' names, its text, whether
    required); ``other``: (a stem, the text of one of the object's other keys), any number
    of which may follow. Built from the last member back: ``first`` is what may open the
    object from member i on (no comma before it), ``rest`` what may follow once something
    was written. rest(i) stays text, made a rule only where first(i - 1) refers to it too,
    so a run of required members is one flat sequence and the text grows linearly."""
    leading = next((i for i, (_, _, needed) in enumerate(members) if needed), len(members))
    rest = first = ""  # after the last member: the other keys, if any
    if other is not None:
        stem, kv = other
        rest = add_rule(f"{stem}-rest", f"( {comma} {kv} )*")
        if leading == len(members):
            first = add_rule(f"{stem}-first", f"( {kv} {rest} )?")
    for i in range(len(members) - 1, -1, -1):
        stem, kv, needed = members[i]
        if i <= leading:  # first(i) is needed up to the first required member
            if " " in rest:  # text of rest(i + 1), so i + 1 < len(members) (past the last
                # member, rest is nothing or the other keys' rule, a name)
                rest = add_rule(f"{members[i + 1][0]}-rest", rest)
            opened = f"{kv} {rest}".rstrip()
            first = add_rule(f"{stem}-first", opened if needed else (
                f"{opened} | {first}" if first else f"( {opened} )?"))
        rest = (f"{comma} {kv} {rest}" if needed else f"( {comma} {kv} )? {rest}").rstrip()
    return first


def distinct(values: list[str], low: int, add_rule: Callable[[str, str], str], stem: str,
             comma: str) -> str:
    """GBNF for each of ``values`` at most once, in the order given, ``comma`` between them,
    at least one when ``low``: first(i) opens with value i or a later one, rest(i) is what
    may follow once value i - 1 was written (a rule each: the text grows linearly)."""
    first = rest = ""
    for i in range(len(values) - 1, -1, -1):
        opened = f"{values[i]} {rest}".rstrip()
        first = add_rule(f"{stem}-{i}", f"{opened} | {first}" if first else opened)
        if i:
            rest = add_rule(f"{stem}-{i}-rest", f"( {comma} {values[i]} )? {rest}".rstrip())
    return first if low else f"( {first} )?"


def entries(entry: str, more: str, low: int, high: int | None) -> str:
    """GBNF for ``low`` (0 or 1) to ``high`` (None: any number) entries of an object or
    array: ``entry``, then each further one as ``more`` (its separator and an entry)."""
    if high == 0:
        return '""'
    body = entry if high == 1 else f"{entry} {counted(more, 0, None if high is None else high - 1)}"
    return body if low else f"( {body} )?"


def counted(item: str, low: int, high: int | None) -> str:
    """GBNF for ``low`` to ``high`` (None: any number) of ``item``, ``low`` at most
    ``REPEAT_LIMIT``: a long ``high`` as ``long_repetition``."""
    if high is not None and high > REPEAT_LIMIT:
        return long_repetition(item, low, high)
    return f"{item}{{{low},{high}}}" if high is not None else f"{item}{{{low},}}"


def long_repetition(item: str, low: int, high: int) -> str:
    """GBNF for ``low`` to ``high`` of ``item`` (``low`` at most ``REPEAT_LIMIT``, ``high``
    above it), exactly, with no count above ``REPEAT_LIMIT``: llama.cpp writes a count n as
    n rules, and llama-cpp-python's converter as n nested groups (Claude Code's
    ``"maxLength": 524288`` ran llama.cpp's parser out of stack). Blocks of b items: q
    blocks and at most r more (high = q * b + r), or fewer blocks and up to b - 1 more.
    Past ``REPEAT_LIMIT`` squared (a million) the blocks stop there: a subset, which no
    answer within ``max_tokens`` reaches."""
    head = f"{item}{{{low}}} " if low else ""
    n = min(high - low, REPEAT_LIMIT * REPEAT_LIMIT)
    b = -(-n // REPEAT_LIMIT)  # so that q <= REPEAT_LIMIT
    if b <= 1:
        return f"{head}{item}{{0,{n}}}"
    q, r = divmod(n, b)
    block = f"({item}{{{b}}})"
    fewer = f"{block}{{0,{q - 1}}} {item}{{0,{b - 1}}}" if q > 1 else f"{item}{{0,{b - 1}}}"
    most = f"{block}{{{q}}} {item}{{0,{r}}}" if r else f"{block}{{{q}}}"
    return f"{head}({fewer} | {most})"


def custom_rule(conv: Any, spec: dict[str, Any], name: str, json_mode: bool) -> str:
    """The rule of the text a custom tool's grammar (``engine.constraints.lark_rules``) allows, bare
    or as the inside of a JSON string (``json_mode``)."""
    try:
        grammar = parse_custom(spec.get("syntax"), spec.get("definition"))
        return add_rules(conv, grammar, f"{name}-custom", json_mode)
    except (GrammarSyntaxError, ValueError) as exc:
        raise GrammarError(f"cannot build the tool's custom grammar: {exc}") from None


def _class_char(c: str) -> str:
    """``c`` as an item of a GBNF character class."""
    return class_char(ord(c))


def _converter() -> Any:
    return _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


