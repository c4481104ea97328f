"""engine/constraints/pattern_lengths.py: a pattern's own lengths, and lengths beside a
pattern written into it (counts capped, minimums raised; a pattern that matches anywhere
left), checked against Python's ``re`` on strings drawn from the result."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.constraints.pattern_lengths import _span, within_lengths
from engine.constraints.schema_merge import FORMATS

ATOMS = ["[a-z]", "\\d", "x", "(ab|c)", "(?:-[0-9a-f]{2})", "[.:/]", "(?:%[0-9A-F]{2})"]
COUNTS = ["", "*", "+", "?", "{2}", "{1,3}", "{2,}", "{0,40}"]


@st.composite
def patterns(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.tuples(st.sampled_from(ATOMS), st.sampled_from(COUNTS)),
                          min_size=1, max_size=5))
    body = "".join(a + c for a, c in parts)
    if draw(st.booleans()):  # a group of alternatives around it, counted
        body = f"({body}|{draw(st.sampled_from(ATOMS))}){draw(st.sampled_from(COUNTS))}"
    return body if draw(st.integers(0, 4)) == 0 else f"^{body}$"  # (not anchored: anywhere)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(patterns(), st.integers(0, 6), st.one_of(st.none(), st.integers(0, 80)),
       st.data())
def test_every_string_the_written_pattern_allows_is_the_patterns_and_within_the_lengths(
        pattern: str, low: int, high: int | None, data: st.DataObject) -> None:
    fitted = within_lengths(pattern, low, high)
    anchored = pattern.startswith("^")
    own = _span(pattern if anchored else f"^(?:{pattern})$")
    assert own is not None
    if anchored and own[0] >= low and (high is None or (own[1] is not None and own[1] <= high)):
        assert fitted == pattern  # the lengths said nothing more
    if fitted is None:
        # only a bound it cannot meet refuses, or a pattern that matches anywhere
        assert own[0] < low or high is not None or not anchored
        return
    assert anchored
    if high is not None:  # Python's own reading of the result's longest match
        assert re._parser.parse(fitted.strip("^$")).getwidth()[1] <= high, fitted  # type: ignore[attr-defined]
    for _ in range(5):
        text = data.draw(st.from_regex(fitted, fullmatch=True))
        assert (re.fullmatch if anchored else re.search)(pattern, text), (pattern, fitted, text)
        assert low <= len(text) and (high is None or len(text) <= high), (fitted, text)


def test_pydantic_s_url_keeps_a_useful_url_within_2083_characters() -> None:
    """``HttpUrl``: ``format: uri``, ``minLength: 1``, ``maxLength: 2083``. The flat URI
    pattern needs one count per part: each part keeps over a hundred characters."""
    fitted = within_lengths(FORMATS["uri"], 1, 2083)
    assert fitted is not None
    span = _span(fitted)
    assert span is not None and span[1] is not None and span[1] <= 2083
    assert re.fullmatch(fitted, "https://user:pw@example.com:8443/" + "p/" * 60 + "?q=" + "x" * 100)
    assert not re.fullmatch(fitted, "https://example.com/" + "a" * 2100)


def test_a_pattern_that_matches_anywhere_or_is_too_short_is_left_as_it_was() -> None:
    assert within_lengths("[a-z]+", 0, 10) is None  # unanchored: its length is not its own
    assert within_lengths("^[a-z]{2}$", 3, None) is None  # never 3 characters
    assert within_lengths("^(ab)*$", 3, None) is None  # a group's count is not raised
    assert within_lengths("^a*$|^b$", 2, None) is None  # nor one option's of several
    assert within_lengths("^x$", 0, 0) is None


def test_what_maskbench_refused_is_written_into_the_pattern() -> None:
    """Lengths beside patterns as real schemas write them (MaskBench's strict refusals)."""
    assert within_lengths("^[0-9a-z-]*$", 4, 63) == "^[0-9a-z-]{4,63}$"  # (10 schemas)
    assert within_lengths("^[a-z]{2,}$", 3, 5) == "^[a-z]{3,5}$"
    assert within_lengths("^[a-z]+(?:-[a-z0-9]+)*$", 3, None) == "^[a-z]{3,}(?:-[a-z0-9]+)*$"
    assert within_lengths("[0-9a-fA-F]+", 12, 12) is None  # (matches anywhere)
