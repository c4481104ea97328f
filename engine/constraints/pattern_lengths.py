"""A string's ``minLength`` / ``maxLength`` beside its ``pattern`` (or a ``format``, which
is one), written into the pattern. Pure Python.

The grammar converter reads a string's pattern or its lengths, not both. Pydantic writes
them together for common fields (``HttpUrl``: ``format: uri``, ``minLength: 1``,
``maxLength: 2083``; ``constr(pattern=..., max_length=...)``), and strict refused such
schemas. A pattern anchored at both ends has a shortest and a longest match
(``lengths``); when those lie within the bounds, the lengths say nothing more. Otherwise
the pattern is narrowed, and every string the narrowed pattern allows has a length within
the bounds (a subset of what the schema allows, as the other exact rewrites are):

- its shortest too short: the lowest counts of its top-level single characters raised,
  first ones first (``raised``: ``^[a-z0-9-]*$`` with ``minLength: 4`` is
  ``^[a-z0-9-]{4,}$``);
- its longest too long: each count of the pattern (``*``, ``+``, ``{n,}``, large
  ``{n,m}``) capped at the largest k that brings its longest within ``maxLength`` (its
  unbounded counts first, all of them if that is not enough).

A pattern not anchored at both ends (one that matches anywhere: the walker writes it with
any text around it), or one neither rewrite fits, is left to be relaxed or refused.
"""

from __future__ import annotations

import re

from engine.constraints.regex_rules import (
    Alt,
    Chars,
    Node,
    RegexError,
    RegexParser,
    Repeat,
    Seq,
    Text,
)
from engine.constraints.schema_patterns import PatternError, class_end

# an escape, a class's start, a count ({n}, {n,}, {n,m}; not a "{" alone), or a character
_PIECE = re.compile(r"\\.|\[|(?P<count>\{(?P<low>\d*)(?P<comma>,)?(?P<high>\d*)\})|.",
                    re.S)
MAX_CAP = 256  # a capped count at most: llama.cpp writes a count n as n nested rules


def lengths(node: Node) -> tuple[int, int | None]:
    """The shortest and the longest text ``node`` matches, in characters (None: no end)."""
    high: int | None
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Text):
        return len(node.text), len(node.text)
    if isinstance(node, Seq):
        low, high = 0, 0
        for item in node.items:
            a, b = lengths(item)
            low += a
            high = None if high is None or b is None else high + b
        return low, high
    if isinstance(node, Alt):
        spans = [lengths(o) for o in node.options]
        highs = [b for _, b in spans]
        return min(a for a, _ in spans), None if None in highs else max(h or 0 for h in highs)
    if isinstance(node, Repeat):
        a, b = lengths(node.item)
        if node.high is None:
            return a * node.low, None if b != 0 else 0
        return a * node.low, None if b is None else b * node.high
    return 0, None  # (a rule reference: unknown)


def capped(pattern: str, k: int, bounded: bool = True) -> str:
    """``pattern`` with every count above ``k`` (unbounded ones too; bounded ones only with
    ``bounded``) brought down to ``k`` (or to its own minimum, if that is larger); classes
    and escapes left as they are."""
    out, at = [], 0
    while at < len(pattern):
        piece = _PIECE.match(pattern, at)
        assert piece is not None  # (the last alternative takes any character)
        text, at = piece[0], piece.end()
        if text == "[":  # a class, whole
            try:
                end = class_end(pattern, at - 1)
            except PatternError:  # (not a pattern: the parser says so after)
                end = len(pattern)
            text, at = pattern[at - 1:end + 1], end + 1
        elif text in ("*", "+"):
            text = f"{{{0 if text == '*' else 1},{k}}}"
        elif piece["count"]:
            low = int(piece["low"] or 0)
            high = None if piece["comma"] and not piece["high"] else int(
                piece["high"] or low)
            if high is None or (bounded and high > k):
                text = f"{{{low},{max(low, k)}}}" if piece["comma"] else text
        out.append(text)
    return "".join(out)


def _span(pattern: str) -> tuple[int, int | None] | None:
    try:
        return lengths(RegexParser(pattern).parse())
    except RegexError:
        return None


def raised(pattern: str, need: int) -> str | None:
    """``pattern`` with the lowest counts of its top-level single characters (a class, an
    escape, a character: one character each) raised by ``need`` characters in all, first
    ones first, each within its own highest; None when they cannot take ``need`` (or the
    pattern has top-level alternatives, whose other options would keep their length)."""
    out, at, depth, single = [], 0, 0, False
    while at < len(pattern):
        piece = _PIECE.match(pattern, at)
        assert piece is not None  # (the last alternative takes any character)
        text, at = piece[0], piece.end()
        one = False  # this piece is one character at the top level
        if text == "[":
            try:
                end = class_end(pattern, at - 1)
            except PatternError:
                return None
            text, at, one = pattern[at - 1:end + 1], end + 1, depth == 0
        elif text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
        elif text == "|" and depth == 0:
            return None
        elif text in ("*", "+", "?") or piece["count"]:
            if single and need > 0:
                low, high = _count(text, piece)
                add = need if high is None else min(need, high - low)
                if add > 0:
                    need -= add
                    text = f"{{{low + add},{'' if high is None else high}}}"
        elif text.startswith("\\"):
            one = depth == 0 and text[1:] not in _NOT_ONE
        elif text not in ("^", "$", "|"):
            one = depth == 0
        out.append(text)
        single = one
    return "".join(out) if need == 0 else None


# escapes that are no single character: anchors and boundaries, back-references
_NOT_ONE = {*"bBAZzG", *"0123456789"}


def _count(text: str, piece: re.Match[str]) -> tuple[int, int | None]:
    """The lowest and highest of a count (``*``, ``+``, ``?``, ``{n}``, ``{n,}``, ``{n,m}``)."""
    if text in ("*", "+", "?"):
        return (1 if text == "+" else 0), (1 if text == "?" else None)
    low = int(piece["low"] or 0)
    return low, (None if piece["comma"] and not piece["high"] else int(piece["high"] or low))


def within_lengths(pattern: str, low: int, high: int | None) -> str | None:
    """``pattern`` such that every string it allows is ``low`` to ``high`` characters long
    (``high`` None: no upper bound); None when that cannot be written (see the module)."""
    if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
        return None  # a pattern matches anywhere in the string: its length is not its own
    span = _span(pattern)
    if span is not None and span[0] < low:  # too short: its first counts raised
        longer = raised(pattern, low - span[0])
        span = None if longer is None else _span(longer)
        if longer is None or span is None or span[0] < low:
            return None
        pattern = longer
    if span is None:
        return None
    if high is None or (span[1] is not None and span[1] <= high):
        return pattern
    for bounded in (False, True):  # the unbounded counts first: the others keep theirs
        best = None
        lo, hi = 1, min(high, MAX_CAP)  # the largest k whose capped pattern fits
        while lo <= hi:
            k = (lo + hi) // 2
            text = capped(pattern, k, bounded)
            got = _span(text)
            if got is not None and got[0] >= low and got[1] is not None and got[1] <= high:
                best, lo = text, k + 1
            else:
                hi = k - 1
        if best is not None:
            return best
    return None
