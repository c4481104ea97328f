"""A custom tool's own grammar, as GBNF rules of the text it describes. Pure Python.

The Responses API lets a ``custom`` tool say what its free-text input must look like:
``format: {"type": "grammar", "syntax": "lark" | "regex", "definition": ...}`` (Codex's
``apply_patch`` is one). ``add_rules`` writes that language into a grammar converter's rules,
in the spelling the call's markup needs (``engine.constraints.regex_rules``: bare, or inside a JSON
string), so the tool's input is enforced wherever its calls are.

The Lark read here is the subset OpenAI's documentation and llguidance describe: rules
(lowercase names) and terminals (uppercase), ``?`` / ``!`` / ``_`` prefixes and priorities
(no bearing on the text), alternatives ``|`` (on continuation lines too), ``-> alias``,
groups ``( )``, optional ``[ ]``, ``? * +``, ``~ n`` and ``~ n..m``, strings (``"..."``;
``i`` for any case), ranges ``"a".."z"``, regular expressions ``/.../`` (flags ``i`` and
``s``), ``%import common.NAME`` (also ``common (A, B)`` and ``-> NAME``), and ``%ignore``
(its terminals may come before any terminal a rule uses, and at the end). ``start`` is the
whole input. A terminal matches each of its strings, as Lark's Earley parser with its
dynamic lexer reads it (not only a greedy lexer's longest match).

A rule's own left recursion (``sum: sum "+" product | product``), which llama.cpp's
grammar cannot follow, is rewritten as a repetition (``sum: product ("+" product)*``).

Refused with a ``GrammarSyntaxError`` naming what: other directives, rule templates,
llguidance's extensions (``%json``, special tokens), a name used but never defined, no
``start``, left recursion through other rules, and what ``engine.constraints.regex_rules`` cannot
follow.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from engine.constraints.regex_rules import (
    MAX_COUNT,
    Alt,
    Chars,
    Node,
    Ref,
    RegexError,
    RegexParser,
    Repeat,
    Seq,
    Text,
    any_case,
    write,
)

# the schema key of a string whose text follows a custom tool's grammar: {"syntax": "lark" |
# "regex", "definition": ...} (api.responses.request; engine.constraints.grammar writes its rules)
CUSTOM_GRAMMAR = "x-custom-grammar"
# characters of a custom tool's grammar: read on the event loop when a request arrives
# (~4 ms a KiB at worst), so bounded well under what a stall there would be felt at
MAX_DEFINITION = 32 * 1024
IGNORED = "%ignore"  # where the ignored terminals may come, before a rule's terminal

# Lark's common.lark, the terminals grammars import (its ESCAPED_STRING without the
# look-behind)
COMMON = {
    "DIGIT": '"0".."9"', "HEXDIGIT": '"a".."f" | "A".."F" | DIGIT', "INT": "DIGIT+",
    "SIGNED_INT": '["+" | "-"] INT', "DECIMAL": 'INT "." INT? | "." INT',
    "_EXP": '("e" | "E") SIGNED_INT', "FLOAT": "INT _EXP | DECIMAL _EXP?",
    "SIGNED_FLOAT": '["+" | "-"] FLOAT', "NUMBER": "FLOAT | INT",
    "SIGNED_NUMBER": '["+" | "-"] NUMBER',
    "ESCAPED_STRING": r'"\"" (/[^"\\\n]/ | "\\" /./)* "\""',
    "LCASE_LETTER": '"a".."z"', "UCASE_LETTER": '"A".."Z"',
    "LETTER": "UCASE_LETTER | LCASE_LETTER", "WORD": "LETTER+",
    "CNAME": '("_" | LETTER) ("_" | LETTER | DIGIT)*', "WS_INLINE": r'(" " | /\t/)+',
    "WS": r"/[ \t\f\r\n]/+", "CR": r"/\r/", "LF": r"/\n/", "NEWLINE": "(CR? LF)+",
    "SH_COMMENT": r"/#[^\n]*/", "CPP_COMMENT": r"/\/\/[^\n]*/",
    "C_COMMENT": r'"/*" /(.|\n)*?/ "*/"', "SQL_COMMENT": r"/--[^\n]*/",
}

_TOKEN = re.compile(r"""
    (?P<space>[ \t\f\r]+ | \\\n)
  | (?P<comment>//[^\n]*)
  | (?P<nl>\n)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?!/)(?:\\/|\\\\|[^/\n])*?/[imslux]*)
  | (?P<op>->|\.\.|[:|()\[\]?*+~,!])
  | (?P<directive>%[a-z]+)
  | (?P<name>[_a-zA-Z][_a-zA-Z0-9]*(?:\.[_a-zA-Z][_a-zA-Z0-9]*)*)
  | (?P<number>\d+)
  | (?P<priority>\.-?\d+)
""", re.VERBOSE)


class GrammarSyntaxError(ValueError):
    """A custom grammar this server cannot read or enforce; says what."""


@dataclass
class _Token:
    kind: str
    text: str
    at: int


def _tokens(text: str) -> list[_Token]:
    out, i = [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m:
            line = text.count("\n", 0, i) + 1
            raise GrammarSyntaxError(f"line {line}: unexpected {text[i:i + 20]!r}")
        kind = m.lastgroup or ""
        if kind not in ("space", "comment"):
            out.append(_Token(kind, m.group(), i))
        i = m.end()
    out.append(_Token("nl", "\n", len(text)))
    return out


def _is_terminal(name: str) -> bool:
    return name.lstrip("_")[:1].isupper()


@dataclass
class LarkGrammar:
    """A parsed Lark grammar: each definition's tree (references are ``Ref`` s to the
    names here), and the terminals ``%ignore`` lets in between terminals."""

    defs: dict[str, Node] = field(default_factory=dict)
    ignore: list[Node] = field(default_factory=list)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.out = LarkGrammar()
        self.used: dict[str, int] = {}  # name -> where it is first used
        self.in_rule = False  # parsing a rule (where %ignore applies), not a terminal

    def error(self, what: str, at: int | None = None) -> GrammarSyntaxError:
        where = self.toks[min(self.i, len(self.toks) - 1)].at if at is None else at
        return GrammarSyntaxError(f"line {self.text.count(chr(10), 0, where) + 1}: {what}")

    def peek(self, kind: str | None = None, text: str | None = None) -> bool:
        t = self.toks[self.i] if self.i < len(self.toks) else None
        return t is not None and (kind is None or t.kind == kind) and \
            (text is None or t.text == text)

    def take(self, kind: str, text: str | None = None) -> _Token:
        if not self.peek(kind, text):
            got = self.toks[self.i].text if self.i < len(self.toks) else "the end"
            raise self.error(f"expected {text or kind}, got {got!r}")
        self.i += 1
        return self.toks[self.i - 1]

    def parse(self) -> LarkGrammar:
        while self.i < len(self.toks):
            if self.peek("nl"):
                self.i += 1
            elif self.peek("directive"):
                self.directive()
            else:
                self.definition()
        for name, at in self.used.items():
            if name not in self.out.defs:
                raise self.error(f"{name!r} is used but never defined", at)
        if "start" not in self.out.defs:
            raise GrammarSyntaxError("the grammar has no 'start' rule")
        return self.out

    def definition(self) -> None:
        if self.peek("op", "?") or self.peek("op", "!"):
            self.i += 1  # inlined or kept in Lark's tree: the same text
        name = self.take("name").text
        if self.peek("priority"):
            self.i += 1
        self.take("op", ":")
        if name in self.out.defs:
            raise self.error(f"{name!r} is defined twice")
        self.in_rule = not _is_terminal(name)
        self.out.defs[name] = self.expansions()
        self.in_rule = False
        self.take("nl")

    def directive(self) -> None:
        word = self.take("directive").text
        if word == "%ignore":
            self.out.ignore.append(self.expansions())
        elif word == "%import":
            self.imports()
        else:
            raise self.error(f"{word} is not supported")
        self.take("nl")

    def imports(self) -> None:
        path = self.take("name").text
        if path.startswith("common."):
            names = [path[len("common."):]]
        elif path == "common" and self.peek("op", "("):
            self.i += 1
            names = [self.take("name").text]
            while self.peek("op", ","):
                self.i += 1
                names.append(self.take("name").text)
            self.take("op", ")")
        else:
            raise self.error(f"%import {path}: only Lark's 'common' terminals can be imported")
        alias = None
        if self.peek("op", "->"):
            self.i += 1
            alias = self.take("name").text
            if len(names) > 1:
                raise self.error("an alias needs a single import")
        for name in names:
            self.common(name, alias or name)

    def common(self, name: str, alias: str) -> None:
        if name not in COMMON:
            raise self.error(f"common.{name} is not one of Lark's common terminals")
        if alias in self.out.defs:
            return
        inner = _Parser(COMMON[name] + "\n")
        self.out.defs[alias] = inner.expansions()
        for dep in inner.used:
            self.common(dep, dep)

    def expansions(self) -> Node:
        options = [self.alias()]
        while True:
            if self.peek("op", "|"):
                self.i += 1
            elif self.peek("nl"):  # "|" at the start of the next line continues the rule
                j = self.i
                while j < len(self.toks) and self.toks[j].kind == "nl":
                    j += 1
                if j < len(self.toks) and self.toks[j].kind == "op" and self.toks[j].text == "|":
                    self.i = j + 1
                else:
                    break
            else:
                break
            options.append(self.alias())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def alias(self) -> Node:
        items: list[Node] = []
        while self.peek("string") or self.peek("regex") or self.peek("name") or \
                self.peek("op", "(") or self.peek("op", "["):
            items.append(self.counted(self.atom()))
        if self.peek("op", "->"):
            self.i += 1
            self.take("name")
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def counted(self, atom: Node) -> Node:
        while self.peek("op"):
            op = self.toks[self.i].text
            if op in ("?", "*", "+"):
                self.i += 1
                low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[op]
            elif op == "~":
                self.i += 1
                low = high = self.count()
                if self.peek("op", ".."):
                    self.i += 1
                    high = self.count()
                if high < low:
                    raise self.error(f"~ {low}..{high} runs backwards")
            else:
                break
            atom = Repeat(atom, low, high)
        return atom

    def count(self) -> int:
        n = int(self.take("number").text)
        if n > MAX_COUNT:
            raise self.error(f"a count above {MAX_COUNT}")
        return n

    def atom(self) -> Node:
        node = self.value()
        if self.in_rule and not (isinstance(node, Ref) and not _is_terminal(node.name)):
            return Seq((Ref(IGNORED), node))  # a terminal of a rule: %ignore's place
        return node

    def value(self) -> Node:
        t = self.toks[self.i]
        self.i += 1
        if t.kind == "op":
            inner = self.expansions()
            if t.text == "(":
                self.take("op", ")")
                return inner
            self.take("op", "]")
            return Repeat(inner, 0, 1)
        if t.kind == "name":
            if "." in t.text:
                raise self.error(f"{t.text!r} is not a name a rule can use")
            self.used.setdefault(t.text, t.at)
            return Ref(t.text)
        if t.kind == "regex":
            body, flags = t.text[1:].rsplit("/", 1)
            try:
                return RegexParser(body.replace("\\/", "/"), flags, "regex").parse()
            except RegexError as exc:
                raise self.error(str(exc)) from None
        text = self.string(t)
        if self.peek("op", ".."):
            self.i += 1
            high = self.string(self.take("string"))
            if len(text) != 1 or len(high) != 1 or high < text:
                raise self.error('a range needs two single characters, in order ("a".."z")')
            return Chars(((ord(text), ord(high)),))
        if t.text.endswith("i"):
            return Seq(tuple(Chars(any_case(((ord(c), ord(c)),))) for c in text))
        return Text(text)

    def string(self, t: _Token) -> str:
        quoted = t.text[:-1] if t.text.endswith("i") else t.text
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = ast.literal_eval(quoted)
        except (ValueError, SyntaxError):
            raise self.error(f"a bad string {t.text!r}", t.at) from None
        if not isinstance(value, str):
            raise self.error(f"a bad string {t.text!r}", t.at)
        return value


def parse_lark(text: str) -> LarkGrammar:
    """The grammar's definitions, or a GrammarSyntaxError naming the first problem."""
    if len(text) > MAX_DEFINITION:
        raise GrammarSyntaxError(f"the grammar is over {MAX_DEFINITION} characters")
    try:
        grammar = _Parser(text).parse()
        for name, node in grammar.defs.items():
            grammar.defs[name] = _unrecursed(name, node)
        _check_left_recursion(grammar.defs)
        return grammar
    except RecursionError:
        raise GrammarSyntaxError("the grammar nests too deeply") from None


def _unrecursed(name: str, node: Node) -> Node:
    """``a: a x | a y | b | c`` (left recursion, which llama.cpp's grammar cannot follow)
    as ``a: (b | c) (x | y)*``: the same texts."""
    options = node.options if isinstance(node, Alt) else (node,)
    tails, heads = [], []
    for option in options:
        items = option.items if isinstance(option, Seq) else (option,)
        if items and items[0] == Ref(name):
            rest = items[1:]
            tails.append(rest[0] if len(rest) == 1 else Seq(rest))
        else:
            heads.append(option)
    if not tails:
        return node
    if not heads:
        raise GrammarSyntaxError(f"rule {name!r} never ends: every option starts with it")
    head = heads[0] if len(heads) == 1 else Alt(tuple(heads))
    tail = tails[0] if len(tails) == 1 else Alt(tuple(tails))
    return Seq((head, Repeat(tail, 0, None)))


def _nullable(node: Node, defs: dict[str, Node], known: dict[str, bool]) -> bool:
    if isinstance(node, Text):
        return not node.text
    if isinstance(node, Chars):
        return False
    if isinstance(node, Ref):
        return known.get(node.name, False)
    if isinstance(node, Seq):
        return all(_nullable(n, defs, known) for n in node.items)
    if isinstance(node, Alt):
        return any(_nullable(n, defs, known) for n in node.options)
    return node.low == 0 or _nullable(node.item, defs, known)


def _firsts(node: Node, known: dict[str, bool]) -> set[str]:
    """The names ``node`` can start with."""
    if isinstance(node, Ref):
        return {node.name}
    if isinstance(node, Seq):
        out: set[str] = set()
        for item in node.items:
            out |= _firsts(item, known)
            if not _nullable(item, {}, known):
                break
        return out
    if isinstance(node, Alt):
        return set().union(*(_firsts(n, known) for n in node.options))
    if isinstance(node, Repeat):
        return _firsts(node.item, known)
    return set()


def _check_left_recursion(defs: dict[str, Node]) -> None:
    """Left recursion through other rules (or behind what can be empty), which llama.cpp
    refuses: named here instead."""
    known = {name: False for name in defs}
    known[IGNORED] = True
    changed = True
    while changed:  # which rules can match the empty text
        changed = False
        for name, node in defs.items():
            if not known[name] and _nullable(node, defs, known):
                known[name] = changed = True
    edges = {name: _firsts(node, known) & set(defs) for name, node in defs.items()}
    for name in defs:
        seen, todo = set(), list(edges[name])
        while todo:
            at = todo.pop()
            if at == name:
                raise GrammarSyntaxError(f"rule {name!r} is left-recursive through other "
                                         "rules or an empty start, which a grammar here "
                                         "cannot follow")
            if at not in seen:
                seen.add(at)
                todo += edges[at]


def parse_custom(syntax: Any, definition: Any) -> LarkGrammar:
    """A custom tool's ``format`` (``syntax`` "lark" or "regex") as a LarkGrammar whose
    ``start`` is the whole input (the same grammars come back on every turn of an agent:
    read once)."""
    if not isinstance(definition, str):
        raise GrammarSyntaxError("'definition' must be a string")
    return _parsed(str(syntax), definition)


@functools.lru_cache(maxsize=64)
def _parsed(syntax: str, definition: str) -> LarkGrammar:
    if syntax == "lark":
        return parse_lark(definition)
    if syntax == "regex":
        if len(definition) > MAX_DEFINITION:
            raise GrammarSyntaxError(f"the pattern is over {MAX_DEFINITION} characters")
        try:
            node = RegexParser(definition, "", "regex").parse()
        except RegexError as exc:
            raise GrammarSyntaxError(str(exc)) from None
        except RecursionError:
            raise GrammarSyntaxError("the pattern nests too deeply") from None
        return LarkGrammar({"start": node})
    raise GrammarSyntaxError(f"syntax {syntax!r}: 'lark' or 'regex'")


def add_rules(conv: Any, grammar: LarkGrammar, prefix: str, json_mode: bool) -> str:
    """Write ``grammar`` into ``conv`` (a GBNF converter: ``_add_rule``, ``_rules``) under
    names starting with ``prefix``; returns the rule of its whole input."""
    names: dict[str, str] = {}
    for i, name in enumerate(grammar.defs):
        names[name] = conv._add_rule(f"{prefix}-{i}", f'"{prefix}-pending-{i}"')
    if grammar.ignore:
        names[IGNORED] = conv._add_rule(f"{prefix}-ignore", "(" + " | ".join(
            write(_renamed(n, names), json_mode) for n in grammar.ignore) + ")*")
    for name, node in grammar.defs.items():
        conv._rules[names[name]] = write(_renamed(node, names), json_mode)
    start = names["start"]
    if IGNORED in names:
        return str(conv._add_rule(f"{prefix}-input", f"{start} {names[IGNORED]}"))
    return start


def _renamed(node: Node, names: dict[str, str]) -> Node:
    """``node`` with references to GBNF rule names; ``%ignore``'s places hold its rule, or
    nothing without one."""
    if isinstance(node, Ref):
        return Ref(names[node.name])
    if isinstance(node, Seq):
        items = tuple(_renamed(n, names) for n in node.items
                      if not (isinstance(n, Ref) and n.name == IGNORED and IGNORED not in names))
        return items[0] if len(items) == 1 else Seq(items)
    if isinstance(node, Alt):
        return Alt(tuple(_renamed(n, names) for n in node.options))
    if isinstance(node, Repeat):
        return Repeat(_renamed(node.item, names), node.low, node.high)
    return node
