"""engine/constraints/schema_merge.py's ``merge``: two schemas that must both hold, as one.
Checked as a property against jsonschema: wherever a merge is made, a value validates
under it exactly when it validates under both parts."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.constraints.schema_merge import UNSAT, merge

VALUES: list[Any] = [None, True, 0, 1, 2.5, -3, 7, "", "ab", "abcdef", [], [1], [1, "x"],
                     {}, {"a": 1}, {"a": "x", "b": 2}, {"b": None}, {"c": [1]}]
KEYWORDS = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["object", "string", "integer", "number", ["string", "null"],
                             ["integer", "object"]]),
    "minimum": st.integers(-2, 3), "maximum": st.integers(0, 8),
    "minLength": st.integers(0, 3), "maxLength": st.integers(1, 6),
    "properties": st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(
        [{"type": "integer"}, {"type": "string"}, {}]), max_size=2),
    "required": st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
    "additionalProperties": st.sampled_from([False, {"type": "integer"}]),
    "enum": st.lists(st.sampled_from(VALUES), min_size=1, max_size=4),
    "pattern": st.sampled_from(["^a", "b"]),
})
# words that say nothing of a value: annotations, definitions, a schema's own words
NOTES = st.fixed_dictionaries({}, optional={
    "title": st.sampled_from(["A", "B"]), "description": st.text(max_size=3),
    "default": st.sampled_from([1, "x", None]), "examples": st.just([1]),
    "x-kind": st.sampled_from(["a", "b"]), "_id": st.integers(0, 2),
    "definitions": st.just({"d": {"type": "string"}})})


def _resolve(ref: str) -> Any:
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(KEYWORDS, NOTES, KEYWORDS, NOTES)
def test_a_merge_holds_exactly_what_both_parts_hold(a: dict[str, Any], a_notes: dict[str, Any],
                                                    b: dict[str, Any], b_notes: dict[str, Any]
                                                    ) -> None:
    left, right = {**a, **a_notes}, {**b, **b_notes}
    merged = merge(left, right, _resolve)
    if merged is None:  # not written as one: the walker relaxes or refuses it
        assert a != {} and b != {}  # (annotations alone never stop a merge)
        return
    check = jsonschema.Draft202012Validator
    for value in VALUES:
        both = check(left).is_valid(value) and check(right).is_valid(value)
        if merged is UNSAT:
            assert not both, (left, right, value)
        else:
            assert check(merged).is_valid(value) == both, (left, right, merged, value)


def test_words_that_change_a_reading_still_stop_a_merge() -> None:
    """A draft, OpenAPI's ``nullable`` and a custom tool's grammar are compared: two
    different ones are not one schema (the first is not kept silently)."""
    for key, one, other in (("$schema", "http://json-schema.org/draft-04/schema#",
                             "https://json-schema.org/draft/2020-12/schema"),
                            ("nullable", True, False),
                            ("x-custom-grammar", {"syntax": "regex", "definition": "a"},
                             {"syntax": "regex", "definition": "b"})):
        assert merge({"type": "string", key: one}, {key: other}, _resolve) is None, key
    merged = merge({"title": "A", "type": "object", "x-id": 1},
                   {"title": "B", "properties": {"a": {"type": "string"}}, "x-id": 2}, _resolve)
    assert merged is not None and merged["properties"] == {"a": {"type": "string"}}
