"""``format`` as the grammar writes it (engine/constraints/schema_merge.py's ``FORMATS``):
every string a format's pattern allows passes the format checker the server validates
answers with (jsonschema's ``format-nongpl`` checkers, its own for IRIs), and the strings
people write for it (a URL with a port, a query or a fragment, a compressed IPv6 address, a
duration of several parts, an upper-case host name) are allowed by llama.cpp's grammar."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from grammar_walk import TextChecker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_model
from engine.constraints.grammar import json_grammar
from engine.constraints.schema_merge import FORMATS
from engine.constraints.schema_values import validator_class

CHECKER = validator_class({}).FORMAT_CHECKER  # the answer check's
DRAFT3 = {"host-name", "ip-address"}  # names of draft 3 (aliases), which it does not check


def test_the_server_checks_every_format_it_writes() -> None:
    """The answer check (api/chat/answer_check.py) reads formats with jsonschema's checkers:
    each format the grammar writes has one installed, or a strict answer's format would
    go unchecked (the format-nongpl checkers; IRIs by engine.constraints.schema_values)."""
    unchecked = {f for f in FORMATS if f not in CHECKER.checkers}
    assert unchecked <= DRAFT3, unchecked


@pytest.mark.parametrize("fmt", sorted(set(FORMATS) - DRAFT3))
def test_every_string_a_format_allows_passes_its_checker(fmt: str) -> None:
    """A strict answer's guarantee for ``format``: the pattern is a subset of what the
    validator accepts (host names had no length bound and allowed "ab--c", which IDNA
    refuses)."""
    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.from_regex(FORMATS[fmt], fullmatch=True))
    def check(text: str) -> None:
        assert CHECKER.conforms(text, fmt), (fmt, text)

    check()


@pytest.fixture(scope="module")
def checker() -> Iterator[TextChecker]:
    c = TextChecker(require_model("qwen-0.5b"))
    yield c
    c.close()


# what people write, each valid for its checker; MaskBench's valid instances held most of
# them and the old patterns (http(s) with a lower-case host and a path only; eight-group
# IPv6; a duration of one part) refused them
WRITTEN = {
    "uri": ["http://localhost:8086", "https://keyserver.ubuntu.com/pks/lookup?op=get&x=0x1",
            "http://www.w3.org/2001/XMLSchema#string", "file:///path/to/file1.js",
            "https://en.wikipedia.org/wiki/Mass%E2%80%93energy", "urn:isbn:0451450523",
            "mailto:john.doe@example.com", "https://user:pw@Host.com:8080/a;b=1/*?q#f",
            "iglu:com.example/event/jsonschema/1-0-0"],
    "ipv6": ["::1", "::", "2001:db8::8a2e:370:7334", "fe80::1", "1:2:3:4:5:6:7:8",
             "2001:DB8:0:0:8:800:200C:417A"],
    "duration": ["P1D", "PT1H30M", "P1Y2M10DT2H30M5S", "P3W", "PT45S", "P2M"],
    "hostname": ["Example.COM", "mesos-master-1.example.com", "localhost", "a1.b2",
                 "bucket.s3.us-east-1.amazonaws.com"],
    "json-pointer": ["", "/a~0b/c~1d", "/x y/0/-"],
    "email": ["John.Doe@Example.COM"],
}
REFUSED = {"uri": ["no scheme", "http://a b", "http://x/%zz", "1http://x"],
           "ipv6": ["1::2::3", ":::", "12345::"], "duration": ["P", "PT", "P1H", "1D"],
           "hostname": ["-a.com", "a_b.com", "a-.com"], "json-pointer": ["a", "/~2"]}


@pytest.mark.parametrize("fmt", sorted(WRITTEN))
def test_what_people_write_for_a_format_is_allowed(checker: TextChecker, fmt: str) -> None:
    for strict in (True, False):
        g = json_grammar({"type": "string", "format": fmt}, strict=strict)
        assert not g.relaxed
        for text in WRITTEN[fmt]:
            assert CHECKER.conforms(text, fmt), text  # (the examples themselves are valid)
            assert checker.accepts(g.text, json.dumps(text)), (fmt, text)
        for text in REFUSED.get(fmt, []):
            assert not checker.accepts(g.text, json.dumps(text)), (fmt, text)


def _schema_with(fmt: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": {"type": "string", "format": fmt}},
            "required": ["v"]}


def test_no_format_lets_a_raw_quote_backslash_or_control_character_in(
        checker: TextChecker) -> None:
    """FORMATS patterns go to the converter as they are: a negated class there
    (json-pointer's ``[^/~]``) let a raw ``"`` end the JSON string early."""
    for fmt in sorted(FORMATS):
        g = json_grammar({"type": "string", "format": fmt}, strict=True)
        # a raw quote, a raw backslash before a letter, raw control characters
        for bad in ('"/""', '"/\\q"', '"/\x01"', '"/a\nb"'):
            assert not checker.accepts(g.text, bad), (fmt, bad)


def test_a_format_inside_an_object_keeps_its_characters(checker: TextChecker) -> None:
    """A URI's sub-delimiters (``'()*+,;=!$&``) in a class the grammar writes bare:
    llama.cpp's grammar has no ``\\(`` escape, and such a grammar did not parse."""
    g = json_grammar(_schema_with("uri"), strict=True)
    assert checker.accepts(g.text, json.dumps({"v": "https://example.com/(x)*+,;=!$&'"}))


def test_iris_are_checked_as_rfc_3987_defines_them() -> None:
    """jsonschema checks IRIs only with rfc3987-syntax (1.3 s and 21 MiB at import, kept
    out by engine/__init__.py): the server's own check maps an IRI to its URI (non-ASCII
    characters percent-encoded) and checks that."""
    for ok in ("http://example.com/ü", "urn:isbn:0451450523", "https://例え.jp/パス?q=1#f"):
        assert CHECKER.conforms(ok, "iri"), ok
    for bad in ("http://a b", "no scheme", "ü", ""):
        assert not CHECKER.conforms(bad, "iri"), bad
    assert CHECKER.conforms("relative/ü", "iri-reference")
