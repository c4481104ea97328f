"""A string's ``minLength`` / ``maxLength`` beside its ``pattern`` (or a ``format``, which
is one), written into the pattern. Pure Python.

The grammar converter reads a string's pattern or its lengths, not both. Pydantic writes
them together for common fields (``HttpUrl``: ``format: uri``, ``minLength: 1``,
``maxLength: 2083``; ``constr(pattern=..., max_length=...)``), and strict refused such
schemas. A pattern anchored at both ends has a shortest and a longest match
(``lengths``); when those lie within the bounds, the lengths say nothing more. When only
its longest is too long, each count of the pattern (``*``, ``+``, ``{n,}``, large ``{n,m}``)
is capped at the largest k that brings its longest within ``maxLength`` (its unbounded counts
first, all of them if that is not enough): every string the
capped pattern allows has a length within the bounds (a subset of what the schema allows,
as the other exact rewrites are). A pattern shorter than ``minLength`` allows, or one not
anchored at both ends, is left to be relaxed or refused as before.
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


def within_lengths(pattern: str, low: int, high: int | None) -> str | None:
    """``pattern`` such that every string it allows is ``low`` to ``high`` characters long
    (``high`` None: no upper bound); None when that cannot be written (see the module)."""
    if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
        return None  # a pattern matches anywhere in the string: its length is not its own
    span = _span(pattern)
    if span is None or span[0] < low:
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
