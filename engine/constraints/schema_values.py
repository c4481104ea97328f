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
from urllib.parse import quote

import jsonschema

try:
    from rfc3986_validator import validate_rfc3986
except ImportError:  # (a dependency; without it jsonschema checks no URI either)
    validate_rfc3986 = None

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


def _iri(rule: str) -> Callable[[object], bool]:
    """RFC 3987's check of an IRI: its URI (section 3.1: each non-ASCII character
    percent-encoded as UTF-8) is an RFC 3986 URI (jsonschema's own IRI checker needs
    rfc3987-syntax, which engine/__init__.py keeps out)."""
    def check(instance: object) -> bool:
        if not isinstance(instance, str):
            return True
        uri = "".join(c if c.isascii() else quote(c, safe="") for c in instance)
        return bool(validate_rfc3986(uri, rule=rule))
    return check


def _format_checker(base: Any) -> Any:
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = dict(base.FORMAT_CHECKER.checkers)
    if validate_rfc3986 is not None:
        for name, rule in (("iri", "URI"), ("iri-reference", "URI_reference")):
            checker.checkers.setdefault(name, (_iri(rule), ()))
    return checker


def validator_class(schema: Any) -> Any:
    """The validator class for ``schema``'s draft (2020-12 when it names none), with
    ``multipleOf`` in decimals and the IRI formats checked (``_iri``)."""
    base = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    if base not in _DECIMAL:
        _DECIMAL[base] = jsonschema.validators.extend(
            base, {"multipleOf": _multiple_of}, format_checker=_format_checker(base))
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
