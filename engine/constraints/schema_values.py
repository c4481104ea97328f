"""Listed values (``enum``, ``const``) checked against the whole schema by the validator.

A schema that lists its values allows at most those, whatever else it says: ``not``,
``if`` / ``then``, ``uniqueItems``, an ``allOf`` that cannot be merged. So instead of
writing those keywords into a grammar (which cannot hold most of them), each listed value
is checked against the whole (sub)schema, and the grammar writes the ones that pass:
exact, for every keyword the validator reads.

The validator is the one the answer check uses (``validator_class``: the schema's own
draft, formats checked, ``multipleOf`` in decimals), built once per schema over its root,
so a ``$ref`` inside the subschema resolves as it does when the answer is checked. Pure
Python (``jsonschema``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import jsonschema

_FLOAT_MULTIPLE_OF = jsonschema.Draft202012Validator.VALIDATORS["multipleOf"]
_DECIMAL: dict[Any, Any] = {}  # each draft's validator with _multiple_of


def _multiple_of(validator: Any, step: Any, instance: Any, schema: Any
                 ) -> Iterator[jsonschema.ValidationError]:
    """``multipleOf`` in decimals, as JSON Schema defines it ("division by this keyword's
    value results in an integer"): jsonschema divides floats, and 0.3 / 0.1 is
    2.9999999999999996, so it called 0.3 no multiple of 0.1."""
    if not validator.is_type(instance, "number") or isinstance(step, bool):
        return
    try:
        quotient = Decimal(str(instance)) / Decimal(str(step))
        whole = quotient == quotient.to_integral_value()
    except (ArithmeticError, ValueError):
        yield from _FLOAT_MULTIPLE_OF(validator, step, instance, schema)
        return
    if not whole:
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step!r}")


def validator_class(schema: Any) -> Any:
    """The validator class for ``schema``'s draft (2020-12 when it names none), with
    ``multipleOf`` in decimals."""
    base = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    if base not in _DECIMAL:
        _DECIMAL[base] = jsonschema.validators.extend(base, {"multipleOf": _multiple_of})
    return _DECIMAL[base]


def listed(node: dict[str, Any], resolve: Callable[[str], Any]) -> list[Any] | None:
    """The values ``node`` lists, itself or in one of its ``allOf`` parts (a part may be a
    local ``$ref``); None when it lists none (an empty ``enum`` is the walker's error)."""
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return list(node["enum"])
    parts = node.get("allOf")
    for part in parts if isinstance(parts, list) else []:
        for _ in range(8):  # a chain of references, followed a few links
            if isinstance(part, dict) and isinstance(part.get("$ref"), str):
                part = resolve(part["$ref"])
        if isinstance(part, dict) and ("const" in part or (
                isinstance(part.get("enum"), list) and part["enum"])):
            return [part["const"]] if "const" in part else list(part["enum"])
    return None


class ValueCheck:
    """``valid(value, subschema)`` for subschemas of one root schema."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._validator: Any = None
        self._broken = False

    def valid(self, value: Any, subschema: Any) -> bool | None:
        """Whether ``value`` is valid under ``subschema`` (a part of the root); None when
        the validator cannot read the schema (a remote reference, a keyword of the wrong
        shape)."""
        if self._broken:
            return None
        try:
            if self._validator is None:
                cls = validator_class(self.root)
                self._validator = cls(self.root, format_checker=cls.FORMAT_CHECKER)
            return bool(self._validator.evolve(schema=subschema).is_valid(value))
        except Exception:  # jsonschema's errors, a recursion, a pattern re cannot compile
            self._broken = True
            return None
