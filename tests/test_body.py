"""api/web/body.py: every class of hostile body is a 400/413 APIError naming its limit; valid
bodies decode as json.loads would. Pure (no model)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.web.body import BodyLimits, decode, decode_object
from api.web.errors import APIError

LIMITS = BodyLimits(max_bytes=1 << 20, max_depth=8, max_string=100, max_items=50,
                    max_number=30)


def refused(raw: str | bytes, limits: BodyLimits = LIMITS) -> APIError:
    with pytest.raises(APIError) as err:
        decode(raw, limits)
    assert err.value.status in (400, 413)
    assert set(err.value.body()["error"]) == {"message", "type", "param", "code"}
    return err.value


@pytest.mark.parametrize("raw", [
    '{"a":' + "[" * 9 + "]" * 9 + "}",
    "[" * 10_000,
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 5000 + "1" + "}" * 5000,
])
def test_deep_nesting_is_refused_naming_the_limit(raw: str) -> None:
    err = refused(raw)
    assert err.code == "nesting_too_deep" and err.param == "max_json_depth"
    assert "max_json_depth = 8" in err.message


def test_nesting_at_the_limit_is_accepted() -> None:
    assert decode("[" * 8 + "]" * 8, LIMITS) == [[[[[[[[]]]]]]]]


@pytest.mark.parametrize("raw,where", [
    ('{"prompt": "\\ud83d"}', "prompt"),
    ('{"messages": [{"content": "ok \\udc00 x"}]}', "messages[0].content"),
    ('{"a\\ud800": 1}', "a\\ud800"),
    ('["\\u0000"]', "[0]"),
    ('{"input": "a\\u0000b"}', "input"),
    ('"\\udfff"', "<body>"),
])
def test_unpaired_surrogates_and_nul_are_refused(raw: str, where: str) -> None:
    err = refused(raw)
    assert err.code == "invalid_unicode" and err.param is not None
    assert err.param.startswith(where)
    json.dumps(err.body(), ensure_ascii=False).encode()  # the error itself is encodable


def test_paired_surrogates_and_astral_text_are_fine() -> None:
    assert decode('{"p": "\\ud83d\\ude00 \U0001F600"}', LIMITS) == {"p": "\U0001F600 \U0001F600"}


@pytest.mark.parametrize("raw,code,param", [
    ('{"temperature": 1' + "0" * 5000 + "}", "number_too_long", "max_number_length"),
    ('{"t": -1' + "0" * 40 + "}", "number_too_long", "max_number_length"),
    ('{"t": 1.' + "0" * 40 + "}", "number_too_long", "max_number_length"),
    ('{"t": 1e400}', "number_out_of_range", None),
    ('{"t": -1e999}', "number_out_of_range", None),
    ('{"t": NaN}', "invalid_json", None),
    ('{"t": Infinity}', "invalid_json", None),
    ('[-Infinity]', "invalid_json", None),
])
def test_huge_and_non_finite_numbers_are_refused(raw: str, code: str, param: str | None) -> None:
    err = refused(raw)
    assert err.code == code and err.param == param


def test_long_strings_and_arrays_and_objects_are_refused() -> None:
    assert refused(json.dumps({"p": "x" * 101})).param == "p"
    assert refused(json.dumps({"x": "y" * 101})).code == "string_too_long"
    assert refused(json.dumps({"k" * 101: 1})).code == "string_too_long"
    assert refused(json.dumps({"a": list(range(51))})).param == "max_array_length"
    assert refused(json.dumps({str(i): i for i in range(51)})).code == "too_many_items"
    assert decode(json.dumps({"a": list(range(50)), "p": "x" * 100}), LIMITS)


def test_duplicate_keys_are_refused() -> None:
    err = refused('{"model": "a", "max_tokens": 1, "model": "b"}')
    assert err.code == "duplicate_key" and err.param == "model"
    assert refused('{"a": {"x": 1, "x": 1}}').code == "duplicate_key"


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", b'{"a": "\xed\xa0\xbd"}', b"{\"a\": 1",
                                 b"", b"   ", b"[1,]", b"\xef\xbb\xbf{}"])
def test_invalid_utf8_and_broken_json_are_400(raw: bytes) -> None:
    assert refused(raw).status == 400


def test_size_limit_is_413() -> None:
    err = refused("[" + "1," * 600_000 + "1]")
    assert err.status == 413 and err.param == "max_body_bytes"


def test_decode_object_wants_an_object() -> None:
    assert decode_object('{"a": 1}', LIMITS) == {"a": 1}
    with pytest.raises(APIError) as err:
        decode_object("[1]", LIMITS, "A frame")
    assert err.value.status == 400 and "A frame must be a JSON object" in err.value.message


def test_a_large_valid_body_decodes_quickly() -> None:
    limits = BodyLimits()
    body = json.dumps({"prompt": list(range(200_000)), "text": "word " * 500_000,
                       "messages": [{"role": "user", "content": "hi " * 10}] * 2000})
    start = time.perf_counter()
    decode(body, limits)
    assert time.perf_counter() - start < 2.0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**60, 2**60)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_valid_values_decode_like_json_loads(value: Any) -> None:
    raw = json.dumps(value)
    try:
        out = decode(raw, BodyLimits(max_depth=64))
    except APIError as exc:  # only refused for a NUL or a surrogate text can hold
        assert exc.code == "invalid_unicode", exc.message
        return
    assert out == json.loads(raw)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_arbitrary_bytes_are_a_value_or_a_400(raw: bytes | str) -> None:
    try:
        decode(raw, LIMITS)
    except APIError as exc:
        assert exc.status == 400


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"a": "\\ud83d"}', '["\\u0000"]'])
def test_json_in_model_text_fails_as_a_value_error(text: str) -> None:
    from parsers import json_text

    with pytest.raises(ValueError):
        json_text.loads(text)
    assert json_text.loads('{"a": ["\\ud83d\\ude00", 1.5]}') == {"a": ["\U0001F600", 1.5]}
