"""A regular expression as a small tree of characters, sequences, alternatives and counts,
written out as GBNF in one of two spellings of the same text. Pure Python.

The text a custom tool's grammar describes (``lark_rules``) lands in a call either
bare (``raw``: Qwen3.5's XML parameters write a value as it is) or inside a JSON string
(``json``: a line break is written ``\\n``, a quote ``\\"``); every node is written in the
spelling it lands in, so both describe the same text.

The dialect is Python's ``re`` (Lark's) and Rust's ``regex`` where they agree: ``.``,
classes with ranges, negation and ``\\d \\w \\s`` (ASCII), groups (``(?:``, named), inline
flags ``i`` and ``s``, ``* + ?`` and ``{n,m}`` (lazy or not: the same text), ``|``, and
``^`` / ``$`` at the ends of the whole pattern. What a grammar cannot follow (look-arounds,
back-references, anchors inside, possessive counts, Unicode property classes, counts over
``MAX_COUNT``) is a ``RegexError`` naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from engine.constraints.schema_patterns import escape_excluded, excluded

MAX_CHAR = 0x10FFFF
MAX_COUNT = 1000  # llama.cpp writes a count n as n rules (json_schema.REPEAT_LIMIT)
JSON_UNSAFE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F))  # escaped in JSON

Ranges = tuple[tuple[int, int], ...]


class RegexError(ValueError):
    """A pattern a grammar cannot enforce; says what and where."""


@dataclass(frozen=True)
class Chars:
    ranges: Ranges  # sorted, disjoint, not touching


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    low: int
    high: int | None  # None: unbounded


@dataclass(frozen=True)
class Ref:
    name: str  # a GBNF rule


Node = Chars | Text | Seq | Alt | Repeat | Ref


def normalize(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def complement(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in ranges:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CHAR:
        out.append((at, MAX_CHAR))
    return normalize(out)


def subtract(ranges: Ranges, minus: Ranges) -> Ranges:
    return intersect(ranges, complement(normalize(list(minus))))


def intersect(a: Ranges, b: Ranges) -> Ranges:
    out = [(max(x, y), min(u, v)) for x, u in a for y, v in b if max(x, y) <= min(u, v)]
    return normalize(out)


_FOLDS = {0x4B: 0x212A, 0x6B: 0x212A, 0x53: 0x17F, 0x73: 0x17F, 0xC5: 0x212B,
          0xE5: 0x212B}  # letters whose case partners lie outside ASCII (Kelvin, long s, Ångström)


def any_case(ranges: Ranges) -> Ranges:
    """``ranges`` with the other case of each ASCII letter (and of single characters)."""
    extra = [(f, f) for c, f in _FOLDS.items() if any(lo <= c <= hi for lo, hi in ranges)]
    for lo, hi in ranges:
        for a, b, shift in ((65, 90, 32), (97, 122, -32)):
            x, y = max(lo, a), min(hi, b)
            if x <= y:
                extra.append((x + shift, y + shift))
        if lo == hi and lo > 127:
            extra += [(ord(c), ord(c)) for c in {chr(lo).lower(), chr(lo).upper()}
                      if len(c) == 1]
    return normalize([*ranges, *extra])


_SHORT = {"d": ((48, 57),), "w": ((48, 57), (65, 90), (95, 95), (97, 122)),
          "s": ((9, 13), (32, 32))}
# the ASCII part of Python's \\d \\w \\s (Unicode classes: its \\s takes 0x1C-0x1F too)
_WIDE = {"d": _SHORT["d"], "w": _SHORT["w"], "s": ((9, 13), (28, 32))}
_ASCII = ((0, 127),)
_CHAR_ESCAPES = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7, "e": 27, "0": 0}
_HEX = {c: re.compile(r"\{([0-9a-fA-F]{1,6})\}|([0-9a-fA-F]{%d})" % n)  # noqa: UP031
        for c, n in (("x", 2), ("u", 4), ("U", 8))}
_COUNT = re.compile(r"\{(\d*)(,(\d*))?\}")


class RegexParser:
    """``parse()``: the tree of ``pattern`` under ``flags`` (``i``, ``s``)."""

    def __init__(self, pattern: str, flags: str = "", what: str = "pattern") -> None:
        self.s, self.i, self.what = pattern, 0, what
        self.icase, self.dotall = "i" in flags, "s" in flags
        self.wide_used = False  # the class being read holds a Unicode \\d \\w \\s
        bad = set(flags) - set("is")
        if bad:
            raise RegexError(f"{what}: flag {''.join(sorted(bad))!r} is not supported")

    def error(self, text: str) -> RegexError:
        return RegexError(f"{self.what} {self.s!r}: {text} (at {self.i})")

    def parse(self) -> Node:
        if self.s.startswith("^"):
            self.i = 1
        node = self.alt()
        if self.i < len(self.s):
            raise self.error("unbalanced ')'")
        return node

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def alt(self) -> Node:
        options = [self.seq()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.seq())
        return Alt(tuple(options)) if len(options) > 1 else options[0]

    def seq(self) -> Node:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            if self.s[self.i] == "$" and self.i == len(self.s) - 1:
                self.i += 1  # the end of the whole pattern: what a full match means
                break
            atom = self.atom()
            if atom is not None:
                items.append(self.counted(atom))
        merged: list[Node] = []
        for item in items:  # runs of characters as one literal
            last = merged[-1] if merged else None
            if isinstance(item, Text) and isinstance(last, Text):
                merged[-1] = Text(last.text + item.text)
            else:
                merged.append(item)
        return merged[0] if len(merged) == 1 else Seq(tuple(merged))

    def counted(self, atom: Node) -> Node:
        while True:
            c = self.peek()
            m = _COUNT.match(self.s, self.i) if c == "{" else None
            if c in ("*", "+", "?"):
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                self.i += 1
            elif m and (m[1] or m[2]):
                low = int(m[1] or 0)
                high = low if m[2] is None else (int(m[3]) if m[3] else None)
                self.i = m.end()
                if high is not None and high < low:
                    raise self.error(f"count {{{low},{high}}} runs backwards")
            else:
                return atom
            if self.peek() == "?":
                self.i += 1  # lazy: the same text
            elif self.peek() == "+":
                raise self.error("possessive counts are not supported")
            if max(low, high or 0) > MAX_COUNT:
                raise self.error(f"a count above {MAX_COUNT}")
            atom = Repeat(atom, low, high)

    def atom(self) -> Node | None:
        c = self.s[self.i]
        self.i += 1
        if c == "(":
            return self.group()
        if c == "[":
            return self.chars(self.class_())
        if c == ".":
            return Chars(((0, MAX_CHAR),) if self.dotall else complement(((10, 10),)))
        if c == "\\":
            return self.escape(in_class=False)
        if c in "*+?":
            raise self.error("nothing to repeat")
        if c in "^$":
            raise self.error(f"{c!r} inside a pattern (anchors only at its ends)")
        if c == "{" and _COUNT.match(self.s, self.i - 1):
            raise self.error("nothing to repeat")
        return self.chars(((ord(c), ord(c)),))

    def chars(self, ranges: Ranges) -> Node:
        if self.icase:
            ranges = any_case(ranges)
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            return Text(chr(ranges[0][0]))
        return Chars(ranges)

    def group(self) -> Node | None:
        s, i = self.s, self.i
        if s.startswith("?", i):
            if s.startswith(("?:",), i):
                self.i += 2
            elif s.startswith(("?P<", "?<"), i) and not s.startswith(("?<=", "?<!"), i):
                end = s.find(">", i)
                if end < 0:
                    raise self.error("unterminated group name")
                self.i = end + 1
            elif m := re.match(r"\?([a-zA-Z]+)(\)|:)", s[i:]):
                saved = self.icase, self.dotall
                flags = set(m[1])
                if flags - set("is"):
                    raise self.error(f"flag {''.join(sorted(flags - set('is')))!r} is not "
                                     "supported")
                self.icase, self.dotall = self.icase or "i" in flags, self.dotall or "s" in flags
                self.i += m.end()
                if m[2] == ")":
                    return None  # inline flags: the rest of the pattern
                inner = self.alt()
                self.icase, self.dotall = saved
                return self.close(inner)
            else:
                raise self.error("look-arounds, conditionals and back-references are not "
                                 "supported")
        return self.close(self.alt())

    def close(self, inner: Node) -> Node:
        if self.peek() != ")":
            raise self.error("missing ')'")
        self.i += 1
        return inner

    def escape(self, in_class: bool, wide: bool = False) -> Node:
        """One escape. ``\\d \\w \\s \\D \\W \\S`` are their ASCII part (never too
        much, and a few ranges, not hundreds, for llama.cpp to test); ``wide``: inside a
        negated class, which then keeps only its ASCII part, ``\\d \\w \\s`` are what
        Python's re matches there (what the class leaves out is never too little)."""
        if self.i >= len(self.s):
            raise self.error("a pattern cannot end with '\\'")
        c = self.s[self.i]
        self.i += 1
        if c.lower() in _SHORT:
            if c.isupper():  # nothing Python's re would not match
                return Chars(complement(_SHORT[c.lower()]) if wide else
                             subtract(_ASCII, _WIDE[c.lower()]))
            self.wide_used = self.wide_used or wide
            return Chars(_WIDE[c] if wide else _SHORT[c])
        if c == "b" and in_class:
            return Text("\b")
        if c in _CHAR_ESCAPES:
            return Text(chr(_CHAR_ESCAPES[c]))
        if c in "xuU":
            m = _HEX[c].match(self.s, self.i)
            if not m or int(m[1] or m[2], 16) > MAX_CHAR:
                raise self.error(f"a bad \\{c} escape")
            self.i = m.end()
            return Text(chr(int(m[1] or m[2], 16)))
        if c.isalnum():
            raise self.error(f"'\\{c}' (anchors, back-references and Unicode classes) is "
                             "not supported")
        return Text(c)

    def class_(self) -> Ranges:
        negate = self.peek() == "^"
        self.i += negate
        self.wide_used = False
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.i >= len(self.s):
                raise self.error("missing ']'")
            c = self.s[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if self.s.startswith(("[:", "&&", "--", "~~"), self.i):
                raise self.error("class set operations and POSIX classes are not supported")
            lo = self.class_item(negate)
            if isinstance(lo, Chars):
                ranges += lo.ranges
                continue
            if self.peek() == "-" and self.s[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.class_item(negate)
                if not isinstance(hi, str) or ord(hi) < ord(lo):
                    raise self.error("a bad range in a class")
                ranges.append((ord(lo), ord(hi)))
            else:
                ranges.append((ord(lo), ord(lo)))
        out = normalize(ranges)
        if self.icase:
            out = any_case(out)
        if negate:
            out = complement(out)
            if self.wide_used:  # [^\\w]: its ASCII part (a few ranges, not hundreds)
                out = intersect(out, _ASCII)
        if not out:
            raise self.error("a class no character matches")
        return out

    def class_item(self, wide: bool) -> Chars | str:
        c = self.s[self.i]
        self.i += 1
        if c != "\\":
            return c
        node = self.escape(in_class=True, wide=wide)
        return node.text if isinstance(node, Text) else node  # type: ignore[return-value]


def gbnf_literal(text: str) -> str:
    return json.dumps(text)  # GBNF string literals use JSON's escapes


def class_char(code: int) -> str:
    """A character as an item of a GBNF character class."""
    c = chr(code)
    if c.isascii() and c.isalnum():
        return c
    return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 \
        else f"\\U{code:08X}"


def class_text(ranges: Ranges) -> str:
    return "[" + "".join(class_char(lo) if lo == hi else f"{class_char(lo)}-{class_char(hi)}"
                         for lo, hi in ranges) + "]"


def write(node: Node, json_mode: bool) -> str:
    """``node`` as a GBNF expression of its text, bare or as the inside of a JSON string."""
    if isinstance(node, Text):
        text = escape_excluded(json.dumps(node.text, ensure_ascii=False)[1:-1]) \
            if json_mode else node.text
        return gbnf_literal(text) if text else '""'
    if isinstance(node, Chars):
        return _chars(node.ranges, json_mode)
    if isinstance(node, Ref):
        return node.name
    if isinstance(node, Seq):
        return "(" + " ".join(write(n, json_mode) for n in node.items) + ")" \
            if node.items else '""'
    if isinstance(node, Alt):
        return "(" + " | ".join(write(n, json_mode) for n in node.options) + ")"
    low, high = node.low, node.high
    count = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((low, high)) or \
        (f"{{{low}}}" if low == high else f"{{{low},}}" if high is None else f"{{{low},{high}}}")
    return f"({write(node.item, json_mode)}){count}"


def _chars(ranges: Ranges, json_mode: bool) -> str:
    """A class; inside a JSON string, its safe characters as they are and its quote,
    backslash, tab, line feed and carriage return escaped (other control characters, which
    text rarely holds, are left out: a narrower class, never a wider one)."""
    if not json_mode:
        return class_text(ranges)
    options = []
    markup = normalize([(ord(c), ord(c)) for c in excluded()])  # (escaped: call markup)
    safe = subtract(subtract(ranges, JSON_UNSAFE), markup)
    if safe:
        options.append(class_text(safe))
    for lo, hi in intersect(ranges, _ESCAPED):
        options += [gbnf_literal(json.dumps(chr(c))[1:-1]) for c in range(lo, hi + 1)]
    for lo, hi in intersect(ranges, markup):
        options += [gbnf_literal(f"\\u{c:04x}") for c in range(lo, hi + 1)]
    if not options:
        raise RegexError("a class of control characters only cannot be written in a "
                         "JSON string")
    return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"


_ESCAPED = normalize([(9, 10), (13, 13), (0x22, 0x22), (0x5C, 0x5C)])
