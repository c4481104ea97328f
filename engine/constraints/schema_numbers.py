"""Regular expressions for JSON numbers within bounds, so that a schema's ``minimum``,
``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` and a decimal ``multipleOf`` are
enforced by the grammar, not hoped for.

Pure Python. A bounded ``integer`` or ``number`` becomes an anchored pattern over JSON's
number syntax without an exponent (``-?(0|[1-9][0-9]*)([.][0-9]+)?``); the grammar
converter turns it into rules (``engine.constraints.grammar``), and ``tests/test_schema_numbers.py``
checks every pattern against the numeric comparison it stands for.

Digits are capped so that every number the pattern admits is told apart from its bounds
by a double, as a validator compares them (``0.30000000000000001 > 0.3`` holds in decimals
but not in floats): an integer part of at most ``INT_DIGITS`` digits (``maximum`` past that
is a bound the cap already keeps), and at most ``SIGNIFICANT`` significant digits in all.
A schema whose bounds cannot be written within those caps is a ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

INT_DIGITS = 15  # an integer's digits when nothing bounds it (a double's exact range)
NUMBER_INT_DIGITS = INT_DIGITS  # a number's integer-part digits when nothing bounds them (its
# fraction then has what is left of SIGNIFICANT: a timestamp 1643723400 under minimum 0)
SIGNIFICANT = 15  # significant digits a double tells apart


def _digits_range(lo: str, hi: str) -> str:
    """A regex for the digit strings of one length from ``lo`` to ``hi`` (same length)."""
    if not lo:
        return ""
    if lo == hi:
        return lo
    if lo[0] == hi[0]:
        return lo[0] + _group(_digits_range(lo[1:], hi[1:]))
    rest = len(lo) - 1
    if set(lo[1:]) <= {"0"} and set(hi[1:]) <= {"9"}:
        return _cls(lo[0], hi[0]) + _any(rest)
    parts = [lo[0] + _group(_digits_range(lo[1:], "9" * rest)) if rest else lo[0]]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(_cls(str(int(lo[0]) + 1), str(int(hi[0]) - 1)) + _any(rest))
    parts.append(hi[0] + _group(_digits_range("0" * rest, hi[1:])) if rest else hi[0])
    return "|".join(parts)


def _cls(a: str, b: str) -> str:
    return a if a == b else f"[{a}-{b}]"


def _any(n: int) -> str:
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _group(rx: str) -> str:
    return f"({rx})" if "|" in rx else rx


def natural_range(lo: int, hi: int | None, digits: int = INT_DIGITS) -> str | None:
    """A regex for the canonical decimal text of the whole numbers ``lo..hi`` (``hi`` None:
    up to ``digits`` digits); None when the range is empty."""
    lo = max(lo, 0)
    top = hi if hi is not None else 10 ** digits - 1
    if top < lo:
        return None
    parts, full = [], []  # full: lengths whose every number is in range (n >= 2)
    for n in range(len(str(lo)), len(str(top)) + 1):
        first, last = max(lo, 10 ** (n - 1) if n > 1 else 0), min(top, 10 ** n - 1)
        if n > 1 and first == 10 ** (n - 1) and last == 10 ** n - 1:
            full.append(n)
        elif first <= last:
            parts.append(_digits_range(str(first), str(last)))
    if full:  # consecutive lengths (range() made them so): one [1-9][0-9]{a,b}
        a, b = full[0] - 1, full[-1] - 1
        parts.append("[1-9]" + (_any(a) if a == b else f"[0-9]{{{a},{b}}}"))
    return "|".join(parts)


def integer_pattern(lo: int | None, hi: int | None) -> str:
    """An anchored regex for the JSON integers from ``lo`` to ``hi`` (None: unbounded on
    that side); a ValueError when there is none."""
    parts = []
    if hi is None or hi >= 0:
        rx = natural_range(lo if lo is not None and lo > 0 else 0, hi)
        if rx is not None:
            parts.append(_group(rx))
    if lo is None or lo < 0:
        rx = natural_range(max(-(hi if hi is not None else -1), 1),
                           -lo if lo is not None else None)
        if rx is not None:
            parts.append("-" + _group(rx))
    if not parts:
        raise ValueError(f"no integer lies between {lo} and {hi}")
    return "^(" + "|".join(parts) + ")$"


# fractions: digit strings t after the point, compared as 0.t; each builder returns
# (whether the empty fraction -- no point at all -- belongs, a regex of the non-empty ones
# of at most r digits, or None)

Frac = tuple[bool, str | None]


def _alt(*parts: str | None) -> str | None:
    kept = [p for p in parts if p]
    return "|".join(kept) if kept else None


def _frac_any(r: int) -> Frac:
    return True, (f"[0-9]{{1,{r}}}" if r > 1 else "[0-9]") if r else None


def _frac_at_least(b: str, r: int, strict: bool) -> Frac:
    """0.t >= 0.b (> with ``strict``); ``b`` without trailing zeros, len(b) <= r."""
    if not b:
        if not strict:
            return _frac_any(r)
        if r == 0:
            return False, None
        # some digit non-zero: k zeros, then 1-9, then anything up to r digits in all
        return False, "|".join(("0" * k) + "[1-9]" + (f"[0-9]{{0,{r - k - 1}}}"
                                                      if r - k - 1 else "")
                               for k in range(r))
    if r == 0:
        return False, None
    d = int(b[0])
    higher = f"[{d + 1}-9]" + (f"[0-9]{{0,{r - 1}}}" if r > 1 else "") if d < 9 else None
    empty, rest = _frac_at_least(b[1:], r - 1, strict)
    same = _join(b[0], empty, rest)
    return False, _alt(higher, same)


def _frac_at_most(b: str, r: int, strict: bool) -> Frac:
    """0.t <= 0.b (< with ``strict``); ``b`` without trailing zeros, len(b) <= r."""
    if not b:
        if strict:
            return False, None
        return True, (f"0{{1,{r}}}" if r > 1 else "0") if r else None
    if r == 0:
        return True, None  # 0 < 0.b
    d = int(b[0])
    lower = (f"[0-{d - 1}]" if d > 1 else "0") + (f"[0-9]{{0,{r - 1}}}" if r > 1 else "") \
        if d > 0 else None
    empty, rest = _frac_at_most(b[1:], r - 1, strict)
    return True, _alt(lower, _join(b[0], empty, rest))


def _frac_between(a: str, b: str, r: int, sa: bool, sb: bool) -> Frac:
    """0.a <= 0.t <= 0.b (strict sides per ``sa``, ``sb``); 0.a <= 0.b."""
    empty = not a and not sa and (bool(b) or not sb)
    if r == 0:
        return empty, None
    da, db = int((a or "0")[0]), int((b or "0")[0])
    if da == db:
        return empty, _join(str(da), *_frac_between(a[1:], b[1:], r - 1, sa, sb))
    low = _join(str(da), *_frac_at_least(a[1:], r - 1, sa))
    mid = (_cls(str(da + 1), str(db - 1)) + (f"[0-9]{{0,{r - 1}}}" if r > 1 else "")) \
        if db - da > 1 else None
    high = _join(str(db), *_frac_at_most(b[1:], r - 1, sb))
    return empty, _alt(low, mid, high)


def _join(digit: str, empty: bool, rest: str | None) -> str | None:
    """``digit`` followed by what (empty, rest) admits."""
    if rest is None:
        return digit if empty else None
    return f"{digit}({rest})?" if empty else f"{digit}({rest})"


def _with_fraction(int_rx: str, frac: Frac) -> str | None:
    empty, rest = frac
    if rest is None:
        return _group(int_rx) if empty else None
    return f"{_group(int_rx)}([.]({rest}))" + ("?" if empty else "")


def _split(x: Decimal) -> tuple[int, str]:
    """A non-negative decimal as its integer part and its fraction digits (no trailing 0)."""
    whole = int(x)
    frac = format(x - whole, "f")
    digits = frac.split(".", 1)[1].rstrip("0") if "." in frac else ""
    return whole, digits


def _lengths(lo: int, hi: int) -> list[tuple[int, int, int]]:
    """``lo..hi`` (whole numbers, lo <= hi) split by their count of digits: (n, from, to)."""
    out = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        first, last = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10 ** n - 1)
        if first <= last:
            out.append((n, first, last))
    return out


def _positive(lo: Decimal, lo_strict: bool, hi: Decimal | None, hi_strict: bool,
              places: Callable[[int], int]) -> str | None:
    """Numbers x >= 0 with lo <= x <= hi (strict per side), the fraction of an integer part
    of n digits at most ``places(n)`` digits."""
    li, lf = _split(lo)
    low = _frac_at_least(lf, places(len(str(li))), lo_strict)
    if hi is not None and int(hi) == li:
        return _with_fraction(str(li), _frac_between(
            lf, _split(hi)[1], places(len(str(li))), lo_strict, hi_strict))
    parts = [_with_fraction(str(li), low)]
    top = int(hi) - 1 if hi is not None else \
        10 ** max(NUMBER_INT_DIGITS, len(str(li))) - 1
    if top > li:
        for n, first, last in _lengths(li + 1, top):
            rx = natural_range(first, last)
            assert rx is not None
            parts.append(_with_fraction(rx, _frac_any(places(n))))
    if hi is not None:
        hi_i, hf = _split(hi)
        parts.append(_with_fraction(str(hi_i), _frac_at_most(hf, places(len(str(hi_i))),
                                                             hi_strict)))
    return _alt(*parts)


def decimal(value: float | int) -> Decimal:
    """A schema's number as the decimal it was written as (a float's shortest form)."""
    try:
        return Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a finite number") from None


def number_pattern(lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool,
                   fraction_digits: int | None = None) -> str:
    """An anchored regex for JSON numbers (no exponent) between the bounds; at most
    ``fraction_digits`` digits after the point (a ``multipleOf`` of 10^-n), and at most
    ``SIGNIFICANT`` digits in all (an integer part of n digits: 15 - n after the point)."""
    if (lo is not None and not lo.is_finite()) or (hi is not None and not hi.is_finite()):
        raise ValueError("a bound is not a finite number")
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_strict or hi_strict))):
        raise ValueError(f"no number lies between {lo} and {hi}")
    def places(n: int) -> int:
        r = max(SIGNIFICANT - n, 0)
        return r if fraction_digits is None else min(r, fraction_digits)

    bounds = [_split(abs(x)) for x in (lo, hi) if x is not None]
    if any(len(frac) > places(len(str(whole))) for whole, frac in bounds):
        raise ValueError("a bound has more digits than a double tells apart (15 in all)")

    parts = []
    zero = Decimal(0)
    if hi is None or hi >= 0:  # x >= 0
        low, low_strict = (lo, lo_strict) if lo is not None and lo >= 0 else (zero, False)
        parts.append(_positive(low, low_strict, hi, hi_strict, places))
    if lo is None or lo < 0:  # x = -y < 0, y > 0
        y_lo, y_strict = (-hi, hi_strict) if hi is not None and hi < 0 else (zero, True)
        rx = _positive(y_lo, y_strict, -lo if lo is not None else None, lo_strict, places)
        if rx is not None:
            parts.append("-(" + rx + ")")
    kept = [p for p in parts if p]
    if not kept:
        raise ValueError(f"no number with the decimals it may have lies between {lo} and {hi}")
    return "^(" + "|".join(kept) + ")$"


def int_bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    """The whole numbers a schema's bounds admit, as (lowest, highest); None: unbounded."""
    def num(key: str) -> float | None:
        v = schema.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    lows, highs = [], []
    if (lo := num("minimum")) is not None:
        strict = schema.get("exclusiveMinimum") is True  # draft 4
        lows.append(math.floor(lo) + 1 if strict and lo == math.floor(lo) else math.ceil(lo))
    if (hi := num("maximum")) is not None:
        strict = schema.get("exclusiveMaximum") is True
        highs.append(math.ceil(hi) - 1 if strict and hi == math.ceil(hi) else math.floor(hi))
    if (xlo := num("exclusiveMinimum")) is not None:
        lows.append(math.floor(xlo) + 1)
    if (xhi := num("exclusiveMaximum")) is not None:
        highs.append(math.ceil(xhi) - 1)
    return (max(lows) if lows else None), (min(highs) if highs else None)


def number_bounds(schema: dict[str, Any]) -> str | None:
    """The anchored pattern of a bounded ``integer`` / ``number`` schema (None: no bounds
    or another type); a ValueError when the bounds admit nothing or cannot be written."""
    kind = schema.get("type")
    bounded = any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum",
                                        "exclusiveMaximum")) or schema.get("$places")
    if kind not in ("integer", "number") or not bounded:
        return None
    if kind == "integer":
        lo_i, hi_i = int_bounds(schema)
        return integer_pattern(lo_i, hi_i)
    lo_v, hi_v = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    lo = decimal(lo_v) if lo_v is not None else None
    hi = decimal(hi_v) if hi_v is not None else None
    lo_strict = hi_strict = False
    if isinstance(xlo, bool):
        lo_strict = xlo
    elif xlo is not None and (lo is None or decimal(xlo) >= lo):
        lo, lo_strict = decimal(xlo), True
    if isinstance(xhi, bool):
        hi_strict = xhi
    elif xhi is not None and (hi is None or decimal(xhi) <= hi):
        hi, hi_strict = decimal(xhi), True
    # a bound past 15 integer digits is not the double a validator compares with (1e23 is
    # 99999999999999991611392): the numbers stop at 15 digits (a subset)
    cap = Decimal(10 ** INT_DIGITS - 1)
    if hi is not None and hi > cap:
        hi, hi_strict = cap, False
    if lo is not None and lo < -cap:
        lo, lo_strict = -cap, False
    if (lo is not None and lo > cap) or (hi is not None and hi < -cap):
        raise ValueError("a bound past 15 integer digits, which a double does not hold")
    return number_pattern(lo, lo_strict, hi, hi_strict, schema.get("$places"))
