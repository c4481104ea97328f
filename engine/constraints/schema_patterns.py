"""A JSON Schema ``pattern`` rewritten into what the grammar converter reads, for text that
lands inside a JSON string.

Pure Python. The converter (``llama_cpp.llama_grammar``) copies much of a regex into GBNF
as written, which breaks in three ways: escapes GBNF has no meaning for (``\\d``, ``\\.``,
``\\-``) make a grammar llama.cpp cannot parse; ``.`` and negated classes let a raw ``"``,
``\\`` or control character into a JSON string (the answer is then not JSON); and
syntax it cannot read at all (``(?:``, lazy quantifiers) fails. ``json_string_pattern``
returns an anchored pattern in the converter's dialect whose every match is a match of the
original and safe unescaped inside a JSON string, or raises ``PatternError`` naming what
cannot be enforced.

Unanchored patterns (JSON Schema's ``pattern`` matches anywhere) get ``.*`` on the open
sides; ``.`` is read as any character a JSON string may hold unescaped.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from contextvars import ContextVar

# llama.cpp sees a count n as n nested rules: past this it is not enforced (relaxed)
REPEAT_LIMIT = 1000
JSON_UNSAFE = '"\\\\\\x00-\\x1F\\x7F'  # class items for ", \ and control characters
SAFE_CHAR = f"[^{JSON_UNSAFE}]"
_SHORTHANDS = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " "}  # \s: the one safe whitespace
# \D \W \S as printable ASCII (a validator's \D refuses other scripts' digits, its \S
# Unicode spaces): subsets without the quote and backslash
_NEGATED = {"D": "[!#-/:-\\x5B\\x5D-~ ]", "W": "[ !#-/:-@\\x5B\\x5D\\x5E`{-~]",
            "S": "[!#-\\x5B\\x5D-~]"}
# \D \W \S above as ranges, for when characters are left out of them (``excluding``)
_NEGATED_RANGES = {"D": [(0x20, 0x21), (0x23, 0x2F), (0x3A, 0x5B), (0x5D, 0x7E)],
                   "W": [(0x20, 0x21), (0x23, 0x2F), (0x3A, 0x40), (0x5B, 0x5B), (0x5D, 0x5E),
                         (0x60, 0x60), (0x7B, 0x7E)],
                   "S": [(0x21, 0x21), (0x23, 0x5B), (0x5D, 0x7E)]}
_CLASS_SPECIAL = {"]": "\\]", "[": "\\[", "-": "\\x2D", "^": "\\x5E"}  # as 1-item classes
_CONVERTER_ESCAPES = set("[]()|{}*+?")  # escapes the converter itself reads as literals


class PatternError(ValueError):
    """A pattern the grammar cannot enforce inside a JSON string; says what."""


# characters a string may not hold as they are while a grammar is built: call markup that
# closes a value with one (MiniMax's "</parameter>") would have its parser cut the value
# there. JSON strings write them as a \u escape (their listed values, ``escape_excluded``);
# a pattern leaves them out of its classes, and one that names one is refused.
_EXCLUDED: ContextVar[tuple[int, ...]] = ContextVar("excluded", default=())


@contextlib.contextmanager
def excluding(chars: str) -> Iterator[None]:
    token = _EXCLUDED.set(tuple(sorted({ord(c) for c in chars})))
    try:
        yield
    finally:
        _EXCLUDED.reset(token)


def excluded() -> str:
    return "".join(map(chr, _EXCLUDED.get()))


def escape_excluded(json_text: str) -> str:
    """JSON text with the excluded characters written as their ``\\u`` escapes (the same
    value; outside strings JSON has none of the characters markup closes with)."""
    for c in excluded():
        json_text = json_text.replace(c, f"\\u{ord(c):04x}")
    return json_text


def _refused(code: int) -> None:
    if code in _EXCLUDED.get():
        raise PatternError(f"the character {chr(code)!r}, with which this model's call "
                           "markup closes a value")


def python_regex(pattern: str) -> None:
    """``re.error`` for a pattern that is no regular expression to Python's ``re`` (the
    validator's: what it cannot read, it cannot check); a count too large for ``re`` is
    left to the count limit (``relax_pattern``)."""
    with contextlib.suppress(OverflowError, RecursionError):
        re.compile(pattern)


def json_string_pattern(pattern: str) -> str:
    """``pattern`` (JSON Schema: matches anywhere) as an anchored pattern for the converter
    whose matches all match ``pattern`` and are JSON-string-safe as written."""
    branches = _split_top(pattern)
    if len(branches) > 1 and any(b.startswith("^") or _anchored_end(b) for b in branches):
        # anchors inside a top-level alternation belong to their own branch
        return "^(" + "|".join(_branch(b) for b in branches) + ")$"
    body, head, tail = pattern, False, False
    if body.startswith("^"):
        body, head = body[1:], True
    if body.endswith("$") and not _escaped_at(body, len(body) - 1):
        body, tail = body[:-1], True
    out = _Rewriter(body).run()  # no top-level "|" here: anchored branches went above
    if head and tail:
        return f"^{out}$"
    return "^" + ("" if head else f"{SAFE_CHAR}*") + f"({out})" + \
        ("" if tail else f"{SAFE_CHAR}*") + "$"


def _anchored_end(text: str) -> bool:
    return text.endswith("$") and not _escaped_at(text, len(text) - 1)


def _branch(branch: str) -> str:
    """One top-level alternative, anchored where it says and open where it does not."""
    head, tail = branch.startswith("^"), _anchored_end(branch)
    body = branch[1 if head else 0:len(branch) - 1 if tail else len(branch)]
    out = _Rewriter(body).run()
    return ("" if head else f"{SAFE_CHAR}*") + f"({out})" + ("" if tail else f"{SAFE_CHAR}*")


def _split_top(rx: str) -> list[str]:
    """``rx`` cut at its top-level ``|``s."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(rx):
        c = rx[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = class_end(rx, i) + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(rx[start:i])
            start = i + 1
        i += 1
    return [*parts, rx[start:]]


def _escaped_at(text: str, i: int) -> bool:
    n = 0
    while i - 1 - n >= 0 and text[i - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


def class_end(rx: str, i: int) -> int:
    j = i + 1
    if j < len(rx) and rx[j] == "^":
        j += 1
    if j < len(rx) and rx[j] == "]":
        j += 1
    while j < len(rx) and rx[j] != "]":
        j += 2 if rx[j] == "\\" else 1
    if j >= len(rx):
        raise PatternError("an unclosed character class")
    return j


class _Rewriter:
    def __init__(self, rx: str) -> None:
        self.rx, self.i = rx, 0
        self.out: list[str] = []

    def _shorthand(self, e: str) -> None:
        """\\D, \\W or \\S: printable ASCII (see ``_NEGATED``), excluded characters left out."""
        if not _EXCLUDED.get():
            self.out.append(_NEGATED[e])
            return
        holes = [(c, c) for c in _EXCLUDED.get()]
        self.out.append("[" + _class_text(_subtract(_NEGATED_RANGES[e], holes)) + "]")

    def run(self) -> str:
        rx = self.rx
        while self.i < len(rx):
            c = rx[self.i]
            if c == "\\":
                self._escape()
            elif c == "[":
                self._class()
            elif c == ".":
                self.out.append(SAFE_CHAR)
                self.i += 1
            elif c == "(":
                if rx.startswith("(?:", self.i):
                    self.out.append("(")
                    self.i += 3
                elif rx.startswith("(?", self.i):
                    raise PatternError(f"'{rx[self.i:self.i + 3]}' (lookaround, named or "
                                       "flagged groups)")
                else:
                    self.out.append("(")
                    self.i += 1
            elif c in "*+?}":
                self.out.append(c)
                self.i += 1
                if self.i < len(rx) and rx[self.i] == "?":  # lazy: the same language
                    self.i += 1
                elif self.i < len(rx) and rx[self.i] == "+":
                    raise PatternError("a possessive quantifier")
            elif c in "^$":
                raise PatternError(f"'{c}' inside the pattern")
            elif c == '"' or ord(c) < 0x20 or c == "\x7f":
                raise PatternError(f"the character {c!r}, which a JSON string escapes")
            elif 0xD800 <= ord(c) <= 0xDFFF:  # (no UTF-8 text holds one: the grammar's
                raise PatternError(f"the lone surrogate U+{ord(c):04X}")  # cannot either)
            else:
                _refused(ord(c))
                self.out.append(c)
                self.i += 1
        return "".join(self.out)

    def _escape(self) -> None:
        rx = self.rx
        if self.i + 1 >= len(rx):
            raise PatternError("a trailing backslash")
        e = rx[self.i + 1]
        self.i += 2
        if e in _SHORTHANDS:
            self.out.append(f"[{_SHORTHANDS[e]}]")
        elif e in "DWS":
            self._shorthand(e)
        elif e in _CONVERTER_ESCAPES:
            self.out.append("\\" + e)
        elif e in "uxU":
            digits = {"u": 4, "x": 2, "U": 8}[e]
            hexa = rx[self.i:self.i + digits]
            if len(hexa) != digits or any(h not in "0123456789abcdefABCDEF" for h in hexa):
                raise PatternError(f"a malformed \\{e} escape")
            code = int(hexa, 16)
            self.i += digits
            if code < 0x20 or code in (0x22, 0x5C, 0x7F) or 0xD800 <= code <= 0xDFFF:
                raise PatternError(f"the character U+{code:04X}, which a JSON string escapes")
            _refused(code)
            self.out.append(f"[\\x{code:02X}]" if code < 0x100 else chr(code))
        elif e.isalnum() or e in "\\\"":
            raise PatternError(f"the escape '\\{e}'")
        else:  # escaped punctuation: the character itself, as a one-item class
            _refused(ord(e))
            self.out.append("[" + _CLASS_SPECIAL.get(e, e) + "]")

    def _class(self) -> None:
        rx = self.rx
        end = class_end(rx, self.i)
        inner = rx[self.i + 1:end]
        self.i = end + 1
        negated = inner.startswith("^")
        if negated:
            inner = inner[1:]
        elif inner in ("\\D", "\\W", "\\S"):  # [\S]: the shorthand itself
            self._shorthand(inner[1])
            return
        ranges: list[tuple[int, int]] = []
        shorthands = False
        j = 0
        while j < len(inner):
            lo, j, shorthand = _class_item(inner, j)
            if shorthand is not None:
                ranges.extend(shorthand)
                shorthands = True
                continue
            assert lo is not None
            if j + 1 < len(inner) and inner[j] == "-":
                hi, k, short = _class_item(inner, j + 1)
                if short is not None or hi is None:
                    raise PatternError("a range ending in a character shorthand")
                if hi < lo:
                    raise PatternError("a character range out of order")
                ranges.append((lo, hi))
                j = k
            else:
                ranges.append((lo, lo))
        if negated and shorthands:
            # a validator's \d, \s, \w reach into other scripts: printable ASCII outside
            # the class instead (a subset)
            ranges, negated = _subtract([(0x20, 0x7E)], ranges), False
        unsafe = UNSAFE + [(c, c) for c in _EXCLUDED.get()]
        if negated:
            self.out.append("[^" + _class_text(ranges + unsafe) + "]")
            return
        safe = _subtract(ranges, unsafe)
        if not safe:
            raise PatternError("a character class of only characters a JSON string escapes")
        self.out.append("[" + _class_text(safe) + "]")


UNSAFE = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]
_SHORT_RANGES = {"d": [(0x30, 0x39)], "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F),
                                            (0x61, 0x7A)], "s": [(0x20, 0x20)]}
_CONTROL = {"n": 0x0A, "r": 0x0D, "t": 0x09, "f": 0x0C, "v": 0x0B}


def _class_item(inner: str, j: int) -> tuple[int | None, int, list[tuple[int, int]] | None]:
    """One item of a class at ``j``: (code point, next index, None) or (None, next, the
    ranges of a shorthand)."""
    c = inner[j]
    if c != "\\":
        return ord(c), j + 1, None
    if j + 1 >= len(inner):
        raise PatternError("a trailing backslash in a character class")
    e = inner[j + 1]
    if e in _SHORT_RANGES:
        return None, j + 2, _SHORT_RANGES[e]
    if e in "DWS":
        raise PatternError(f"'\\{e}' inside a character class")
    if e in _CONTROL:
        return _CONTROL[e], j + 2, None
    if e in "uxU":
        digits = {"u": 4, "x": 2, "U": 8}[e]
        hexa = inner[j + 2:j + 2 + digits]
        if len(hexa) != digits or any(h not in "0123456789abcdefABCDEF" for h in hexa):
            raise PatternError(f"a malformed \\{e} escape")
        return int(hexa, 16), j + 2 + digits, None
    if e.isalnum():
        raise PatternError(f"the escape '\\{e}' inside a character class")
    return ord(e), j + 2, None


def _subtract(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]
              ) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for h_lo, h_hi in holes:
            nxt = []
            for a, b in pieces:
                if b < h_lo or a > h_hi:
                    nxt.append((a, b))
                    continue
                if a < h_lo:
                    nxt.append((a, h_lo - 1))
                if b > h_hi:
                    nxt.append((h_hi + 1, b))
            pieces = nxt
        out.extend(pieces)
    return out


def _char(code: int) -> str:
    c = chr(code)
    if c.isascii() and c.isalnum():
        return c
    if code < 0x100:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _class_text(ranges: list[tuple[int, int]]) -> str:
    return "".join(_char(a) if a == b else f"{_char(a)}-{_char(b)}" for a, b in ranges)


_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}")


def relax_pattern(pattern: str) -> tuple[str, list[str]]:
    """``pattern`` with every ``{n,m}`` whose bound is above ``REPEAT_LIMIT`` relaxed: a
    large ``m`` is dropped (``{n,}``), a large ``n`` as well (``+`` or ``*``). Escapes and
    character classes are skipped as the converter reads them. Returns the pattern and
    what was relaxed."""
    out: list[str] = []
    relaxed: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        elif c == "[":  # to the first unescaped ']', as the converter reads a class
            j = i + 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            out.append(pattern[i:j + 1])
            i = j + 1
        elif c == "{" and (m := _QUANTIFIER.match(pattern, i)):
            low = int(m[1]) if m[1] else 0
            high = (int(m[3]) if m[3] else None) if m[2] else low
            if low > REPEAT_LIMIT or (high is not None and high > REPEAT_LIMIT):
                relaxed.append(f"{m[0]} relaxed")
                out.append(("+" if low else "*") if low > REPEAT_LIMIT or low <= 1
                           else f"{{{low},}}")
            else:
                out.append(m[0])
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out), relaxed
