"""parsers/json_text.py: JSON inside text, and a custom tool's input from its arguments."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsers.json_text import custom_input, loads


@pytest.mark.parametrize("text", ['"\\u0000"', '["\\ud800"]', "[" * 5000 + "]" * 5000, "{"])
def test_what_cannot_be_sent_back_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)


@given(st.text())
def test_a_custom_tools_input_is_the_string_it_was_offered_with(text: str) -> None:
    arguments = json.dumps({"input": text})
    try:
        loads(arguments)
    except ValueError:  # a surrogate or NUL the client could not be sent: kept as written
        assert custom_input(arguments) == arguments
    else:
        assert custom_input(arguments) == text


@pytest.mark.parametrize("arguments", ["", "patch text, not JSON", "[1]", '"s"', "null",
                                       '{"input": 3}', '{"other": "x"}', '{"input": ["a"]}'])
def test_arguments_of_another_shape_are_the_input_as_written(arguments: str) -> None:
    assert custom_input(arguments) == arguments
