"""A GBNF grammar (llama.cpp's) in llguidance's Lark form, for the mask engine
(``engine.sampling.masks``). Pure Python.

llguidance ships this conversion (``llguidance.gbnf_to_lark``). This module writes the same
text wherever llguidance reads that text, about 2.5x faster and at any depth, and a form
llguidance reads where it does not:

- its parser moves one character at a time through objects and recurses once per nested
  group: about 1 ms per 1,000 characters, and a grammar nested a few hundred groups deep
  ends in a ``RecursionError``. Here one regular expression splits the text into tokens
  and an explicit stack builds each rule's text as its groups close;
- the JSON Schema converter writes ``U{0,n}`` as ``(U (U (U)?)?)?``, one group a
  repetition; past about 50 llguidance refuses the nesting (every ``maxLength`` or
  ``maxItems`` over that). A chain deeper than ``CHAIN_NESTED`` is written ``U{0,n}``;
- ``x+?`` for ``(x+)?``, ``\\ue9`` for ``\\u00e9``, ``\\U...`` and ``"\\["``, which
  llguidance does not read; two rule names that become one, which it refuses.

Its rules, as llguidance's: ``root`` becomes ``start``; a rule made only of literals,
character classes and such rules (not ``start``, not recursive) is a terminal, named in
upper case; names lose their dashes and camel case. Anything this does not read raises
``ValueError`` (the caller then leaves the grammar to llama.cpp alone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r"""[ \t]*(?:
    (?P<nl>\r\n?|\n)
  | (?P<comment>\#[^\r\n]*)
  | (?P<define>[\w-]+)[ \t]*::=
  | (?P<name>[\w-]+)
  | (?P<literal>"(?:[^"\\]|\\.)*")
  | (?P<klass>\[(?:[^\]\\]|\\.)*\])
  | (?P<dot>\.)
  | (?P<repeat>\{\s*(?P<low>\d+)\s*(?:(?P<comma>,)\s*(?P<high>\d*)\s*)?\})
  | (?P<op>[()|*+?])
)""", re.VERBOSE | re.DOTALL)
_ESCAPE = re.compile(r"\\(?:(?P<simple>[\"\\\[\]nrt])|x(?P<x>[0-9a-fA-F]{2})"
                     r"|u(?P<u>[0-9a-fA-F]{4})|U(?P<U>[0-9a-fA-F]{8})|(?P<bad>.|$))", re.DOTALL)
_REF = re.compile("\x00([0-9]+)\x00")
_CAMEL = re.compile(r"([a-z])([A-Z])")


@dataclass
class _Node:
    text: str
    atomic: bool  # a literal, class, reference or repetition (no parentheses needed)
    alternatives: list[str] | None = None  # a rule's top-level alternatives (2 or more)
    chain: tuple[str, str, int] | None = None  # (U, U's text, n): U{0,n} spelt nested
    repetition: bool = False  # x*, x+, x?, x{m,n}: repeated again, it takes parentheses


CHAIN_NESTED = 8  # a chain of optional groups deeper than this is written as a count


@dataclass
class _Group:
    alternatives: list[_Node] = field(default_factory=list)
    sequence: list[_Node] = field(default_factory=list)
    parts: list[_Node] | None = None  # the last element's sequence, when it is one group's
    last: list[_Node] = field(default_factory=list)  # the last sequence closed

    def close_sequence(self) -> None:
        seq = self.sequence
        self.alternatives.append(seq[0] if len(seq) == 1 else _Node(
            " ".join(n.text for n in seq) if seq else '""', False))
        self.last = seq
        self.sequence = []

    def close(self) -> tuple[_Node, list[_Node] | None]:
        """The group as one node, and its sequence when it has one alternative."""
        self.close_sequence()
        alts = self.alternatives
        if len(alts) == 1:
            return alts[0], self.last
        texts = [a.text for a in alts]
        return _Node("(" + " | ".join(texts) + ")", False, texts), None


def _escapes(body: str, literal: bool = False) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group("simple") is not None:  # (in a Lark string, "[" and "]" are not escaped)
            return m.group("simple") if literal and m.group("simple") in "[]" else m.group(0)
        if m.group("x") is not None:
            return m.group(0)
        # (llguidance's conversion writes \u and \U without their leading zeros, which
        # llguidance does not read; nor \U at all)
        if m.group("u") is not None:
            return m.group(0)
        if m.group("U") is not None:
            code = int(m.group("U"), 16)
            if code > 0x10FFFF or 0xD800 <= code < 0xE000:
                raise ValueError(f"invalid escape {m.group(0)!r}")
            return f"\\u{code:04x}" if code < 0x10000 else chr(code)
        raise ValueError(f"invalid escape {m.group(0)!r}")
    return _ESCAPE.sub(one, body)


def _klass(text: str) -> str:
    out = ["["]
    body = text[1:-1]
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == "\\":
            m = _ESCAPE.match(body, i)
            assert m is not None
            out.append(_escapes(m.group(0)))
            i = m.end()
            continue
        out.append("\\" + c if c in "/[" else c)
        i += 1
    out.append("]")
    return "/" + "".join(out) + "/"


def _optional(node: _Node, parts: list[_Node], compact_after: int) -> _Node:
    """``node?``, where ``node`` is the sequence ``parts``. ``(U (U (U)?)?)?`` (how the
    JSON Schema converter writes ``U{0,3}``) nests a group per repetition, past what
    llguidance reads; deeper than ``compact_after`` it is written ``U{0,n}``, the same
    language."""
    if not parts:
        return _repeat(node, 0, 1)
    tail = parts[-1].chain
    unit = parts[:-1] if tail is not None else parts
    key = "\x01".join(n.text for n in unit)
    if tail is not None and tail[0] == key:
        _, unit_text, n = tail
        n += 1
    else:
        if tail is not None:  # a chain of another unit inside: this one starts afresh
            unit = parts
            key = "\x01".join(n.text for n in unit)
        unit_text = unit[0].text if len(unit) == 1 and unit[0].atomic else (
            "(" + " ".join(u.text for u in unit) + ")")
        n = 1
    out = (_repeat(node, 0, 1) if n <= compact_after else
           _Node(f"{unit_text}{{0,{n}}}", True, repetition=True))
    out.chain = (key, unit_text, n)
    return out


def _repeat(node: _Node, low: int, high: int | None) -> _Node:
    # (llguidance's conversion writes x+? for (x+)?, which llguidance does not read)
    inner = node.text if node.atomic and not node.repetition else f"({node.text})"
    if low == 0 and high is None:
        text = inner + "*"
    elif low == 1 and high is None:
        text = inner + "+"
    elif low == 0 and high == 1:
        text = inner + "?"
    else:
        text = f"{inner}{{{low},{'' if high is None else high}}}"
    return _Node(text, True, repetition=True)


@dataclass
class _Rule:
    name: str
    body: _Node
    comment: str
    refs: set[str]


def _parse(text: str, compact_after: int) -> tuple[dict[str, _Rule], list[str]]:
    if "\x00" in text:
        raise ValueError("NUL in the grammar")
    rules: dict[str, _Rule] = {}
    ref_ids: dict[str, int] = {}
    ref_names: list[str] = []
    comment = ""
    name: str | None = None
    stack: list[_Group] = []
    refs: set[str] = set()
    after_bar = False  # newlines may follow a '|' (and '::=', '(')

    def finish() -> None:
        nonlocal name, comment, refs
        assert name is not None
        body, _ = stack.pop().close()
        rules[name] = _Rule(name, body, comment, refs)
        name, comment, refs = None, "", set()

    pos = 0
    for m in _TOKEN.finditer(text):
        if m.start() != pos:
            break
        pos = m.end()
        kind = m.lastgroup if m.lastgroup not in ("low", "comma", "high") else "repeat"
        if kind == "comment":
            comment += "//" + m.group("comment")[1:] + "\n"
            continue
        if kind == "nl":
            if name is not None and len(stack) == 1 and not after_bar:
                finish()
            continue
        if name is None:
            if kind != "define":
                raise ValueError(f"expected a rule at {text[m.start():m.start() + 20]!r}")
            name, stack, after_bar = m.group("define"), [_Group()], True
            continue
        group = stack[-1]
        after_bar = False
        if kind in ("name", "define"):
            if kind == "define":
                raise ValueError("a rule inside a rule")
            ref = m.group("name")
            if ref not in ref_ids:
                ref_ids[ref] = len(ref_names)
                ref_names.append(ref)
            refs.add(ref)
            group.sequence.append(_Node(f"\x00{ref_ids[ref]}\x00", True))
            group.parts = None
        elif kind == "literal":
            body = _escapes(m.group("literal")[1:-1], literal=True)
            group.sequence.append(_Node(f'"{body}"', True))
            group.parts = None
        elif kind == "klass":
            group.sequence.append(_Node(_klass(m.group("klass")), True))
            group.parts = None
        elif kind == "dot":
            group.sequence.append(_Node("/./", True))
            group.parts = None
        elif kind == "repeat" or m.group("op") in "*+?":
            if not group.sequence:
                raise ValueError("a repetition of nothing")
            if kind == "repeat":
                low = int(m.group("low"))
                high = (low if m.group("comma") is None else
                        int(m.group("high")) if m.group("high") else None)
            else:
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[m.group("op")]
            node = group.sequence[-1]
            group.sequence[-1] = (_optional(node, group.parts or [node], compact_after)
                                  if (low, high) == (0, 1) else _repeat(node, low, high))
            group.parts = None
        elif m.group("op") == "|":
            group.close_sequence()
            after_bar = True
        elif m.group("op") == "(":
            stack.append(_Group())
            after_bar = True
        else:  # ")"
            if len(stack) == 1:
                raise ValueError("unbalanced ')'")
            node, parts = stack.pop().close()
            stack[-1].sequence.append(node)
            stack[-1].parts = parts
    if text[pos:].strip(" \t"):
        raise ValueError(f"unexpected {text[pos:pos + 20]!r}")
    if name is not None:
        if len(stack) != 1:
            raise ValueError("unbalanced '('")
        finish()
    return rules, ref_names


def gbnf_to_lark(text: str, compact_after: int = CHAIN_NESTED) -> str:
    """``text`` (GBNF) in llguidance's Lark form, as ``llguidance.gbnf_to_lark`` writes it
    where llguidance reads that; chains of optional groups deeper than ``compact_after``
    written as counts."""
    rules, ref_names = _parse(text, compact_after)
    for rule in rules.values():
        for ref in rule.refs:
            if ref not in rules:
                raise ValueError(f"rule {ref!r} not found")
    if "root" not in rules:
        raise ValueError("no 'root' rule")
    order = {name: i for i, name in enumerate(rules)}
    # terminals: every rule a rule refers to is a terminal; 'start' never is
    pending = {name: len(rule.refs) for name, rule in rules.items()}
    users: dict[str, list[str]] = {}
    for name, rule in rules.items():
        for ref in rule.refs:
            users.setdefault(ref, []).append(name)
    terminal: set[str] = set()
    ready = [n for n, k in pending.items() if k == 0 and n != "root"]
    while ready:
        name = ready.pop()
        terminal.add(name)
        for user in users.get(name, ()):
            pending[user] -= 1
            if pending[user] == 0 and user != "root":
                ready.append(user)
    # names, renamed in turn as llguidance does (a clash is an error)
    final = {name: name for name in rules}
    taken = dict(final)  # current name -> original

    def rename(original: str, new: str) -> None:
        if new in taken:  # (llguidance's conversion fails here): the first free suffix
            new = next(f"{new}_{i}" for i in range(2, len(taken) + 3)
                       if f"{new}_{i}" not in taken and f"{new}_{i}" not in final)
        del taken[final[original]]
        final[original] = new
        taken[new] = original

    rename("root", "start")
    for original in list(taken.values()):
        current = final[original]
        new = _CAMEL.sub(r"\1_\2", current.replace("-", "_")).lower()
        new = new.upper() if original in terminal else new.lower()
        if current != new:
            rename(original, new)
    names = [final[n] for n in ref_names]

    def resolve(s: str) -> str:
        return _REF.sub(lambda m: names[int(m.group(1))], s)

    out = ["%llguidance {}\n\n"]
    prev_nl = True
    for name in sorted(rules, key=order.__getitem__):
        rule = rules[name]
        body = rule.body
        top = ("\n     | ".join(body.alternatives) if body.alternatives is not None
               else body.text)
        s = resolve(f"{rule.comment}{final[name]}: {top}")
        if not prev_nl and "\n" in s:
            out.append("\n")
        out.append(s + "\n")
        prev_nl = "\n" in s
        if prev_nl:
            out.append("\n")
    return "".join(out)
