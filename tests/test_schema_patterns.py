"""Patterns rewritten for JSON strings: every string the rewritten pattern matches is
matched by the original (as a validator searches: Python's ``re.search``) and holds no
character a JSON string must escape; what cannot be rewritten is a ``PatternError``."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.constraints.schema_patterns import PatternError, json_string_pattern

PATTERNS = [
    r"^\d{3}-\d{4}$", r"^[A-Z][a-z]+\.$", "abc", r"^[^@]+@[^@]+\.[a-z]{2,}$", r"^(?:a|b)+?$",
    r"[ -~]+", r"^\w+\s\w+$", "a|b", r"^v?\d+(\.\d+){0,3}|^dev-", r"^[\S]+$", r"^\S+$",
    r"^\D\W$", r"^[^\"]*$", r'^["a]+$', r"^[\u0041-\u005A]{2}$", r"^\x41\u00e9$", r"\$\^",
    r"^[a\-z]+$", r"^[\]\[]$", r"^(ab|cd){2}$", r"^.{2,3}$", r"^[^\d\s]+$", r"^a|b$",
]
UNSAFE = re.compile(r'["\\\x00-\x1f\x7f]')


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_match_of_the_rewrite_matches_the_original(pattern: str) -> None:
    rewritten = json_string_pattern(pattern)
    assert rewritten.startswith("^") and rewritten.endswith("$")

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_regex(rewritten, fullmatch=True))
    def check(text: str) -> None:
        assert re.search(pattern, text), (pattern, rewritten, text)
        assert not UNSAFE.search(text), (rewritten, text)

    check()


@pytest.mark.parametrize("pattern", [
    r"^(?=a)b$", r"(a)\1", r"^a\b", "^a$b", "^\\t$", "^[\"]$", "[unclosed",
    r"^a\\b$", r"^\p{L}$",
])
def test_what_cannot_be_enforced_is_a_pattern_error(pattern: str) -> None:
    with pytest.raises(PatternError):
        json_string_pattern(pattern)


def test_a_lone_surrogate_in_a_pattern_is_refused_not_copied_into_the_grammar() -> None:
    """No UTF-8 text holds a lone surrogate, so neither can a grammar's: copied as it is,
    the grammar's text could not even be encoded for llama.cpp."""
    with pytest.raises(PatternError, match="surrogate"):
        json_string_pattern("^\ud800$")
