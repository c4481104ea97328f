"""Number patterns against the comparisons they stand for: every number a pattern admits
lies within its bounds as a validator compares them (floats), and every number of a few
digits within them is admitted."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.constraints.schema_numbers import decimal, integer_pattern, number_pattern

small = st.integers(-1200, 1200)
bounds = st.one_of(st.none(), small)


def _texts(values: list[int]) -> list[str]:
    return [str(v) for v in values]


@settings(max_examples=300, deadline=None)
@given(bounds, bounds, st.lists(st.integers(-3000, 3000), min_size=20, max_size=60))
def test_integer_patterns(lo: int | None, hi: int | None, values: list[int]) -> None:
    if lo is not None and hi is not None and lo > hi:
        with pytest.raises(ValueError):
            integer_pattern(lo, hi)
        return
    rx = re.compile(integer_pattern(lo, hi))
    edges = [x + d for x in (lo, hi) if x is not None for d in (-1, 0, 1)]
    for v in [*values, *edges, 0]:
        inside = (lo is None or v >= lo) and (hi is None or v <= hi)
        assert bool(rx.fullmatch(str(v))) == inside, (lo, hi, v, rx.pattern)
    for bad in ("-0", "01", "+1", "1.0", "", "-"):
        assert not rx.fullmatch(bad)


decimals = st.decimals(min_value=-300, max_value=300, places=3, allow_nan=False,
                       allow_infinity=False).map(lambda d: d.normalize())


def _candidates(lo: Decimal | None, hi: Decimal | None, extra: list[Decimal]) -> list[str]:
    out = {format(x, "f") for x in extra}
    for b in (lo, hi):
        if b is None:
            continue
        for step in ("0.001", "0.0001", "0.1", "1", "0.0000001", "0.00000000001234"):
            for x in (b - Decimal(step), b, b + Decimal(step)):
                out.add(format(x, "f"))
    out |= {"0", "0.0", "0.5", "-0.5", "1.000", "-1", "10", "12.25", "0.0160425",
            "-3.14159265358979", "123456789.123456", "0.12345678901234", "99.9999999",
            "1643723400", "1670407800000.5", "-123456789012345", "12345678901234.5"}
    return sorted(out)


def _canonical(text: str) -> bool:
    """JSON number text as a model may write it, within the pattern's digit caps: an
    integer part of at most 15 digits, 15 digits in all (a fraction of 14 after "0.")."""
    m = re.fullmatch(r"-?(0|[1-9][0-9]{0,14})(\.[0-9]+)?", text)
    if m is None or len(m[1]) + len(m[2] or ".") - 1 > 15:
        return False
    return text.lstrip("-") != "0" * len(text.lstrip("-")) or text == "0"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), decimals), st.booleans(), st.one_of(st.none(), decimals),
       st.booleans(), st.lists(decimals, max_size=30))
def test_number_patterns(lo: Decimal | None, lo_strict: bool, hi: Decimal | None,
                         hi_strict: bool, extra: list[Decimal]) -> None:
    try:
        rx = re.compile(number_pattern(lo, lo_strict, hi, hi_strict))
    except ValueError:
        assert lo is not None and hi is not None and (
            lo > hi or (lo == hi and (lo_strict or hi_strict)))
        return
    flo = float(lo) if lo is not None else None
    fhi = float(hi) if hi is not None else None
    for text in _candidates(lo, hi, extra):
        value = json.loads(text)  # as a validator reads the answer
        inside = (flo is None or (value > flo if lo_strict else value >= flo)) and \
            (fhi is None or (value < fhi if hi_strict else value <= fhi))
        matched = rx.fullmatch(text) is not None
        if matched:
            assert inside, (lo, lo_strict, hi, hi_strict, text)
            assert not re.fullmatch(r"-0(\.0*)?", text)  # no negative zero
        elif inside and _canonical(text) and text != "-0":
            raise AssertionError(("refused", lo, lo_strict, hi, hi_strict, text, rx.pattern))


def test_decimal_places_and_float_bounds() -> None:
    cents = re.compile(number_pattern(decimal(0), False, decimal(100), False, 2))
    assert cents.fullmatch("99.99") and cents.fullmatch("100") and cents.fullmatch("0.5")
    assert not cents.fullmatch("0.001") and not cents.fullmatch("100.01")
    unit = re.compile(number_pattern(decimal(0.0), True, decimal(1.0), True))
    assert unit.fullmatch("0.5") and not unit.fullmatch("0") and not unit.fullmatch("1")
    assert not unit.fullmatch("1.0") and not unit.fullmatch("0.0")
    # the closest a validator can tell apart from the bound, and no closer
    third = re.compile(number_pattern(decimal(0.3), True, None, False))
    assert third.fullmatch("0.300001") and not third.fullmatch("0.30000000000000001")
    with pytest.raises(ValueError):
        number_pattern(decimal(0.1 + 0.2), False, None, False)  # 17 significant digits


def test_a_bound_past_15_digits_stops_the_numbers_at_15() -> None:
    """``maximum: 1e23`` is the double 99999999999999991611392: a pattern of 23-digit
    numbers let 99999999999999999999999 through, which the validator refuses (JSON reads
    it as an exact integer). Numbers stop at 15 integer digits; a lower bound past them
    writes nothing."""
    from engine.constraints.schema_numbers import number_bounds

    for bound in (1e23, 1.2345678901234568e18):
        rx = re.compile(number_bounds({"type": "number", "maximum": bound, "minimum": 0}))
        assert rx.fullmatch("999999999999999") and not rx.fullmatch("9" * 16)
        assert not rx.fullmatch("99999999999999999999999")
    with pytest.raises(ValueError):
        number_bounds({"type": "number", "minimum": 1e20})
