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

import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import jsonschema

from engine.constraints.schema_merge import deref
from engine.constraints.schema_terms import ENUM_LIMIT, Unsatisfiable

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
            checker.checkers[name] = (_iri(rule), ())  # (whatever jsonschema found)
    return checker


def validator_class(schema: Any) -> Any:
    """The validator class for ``schema``'s draft (2020-12 when it names none), with
    ``multipleOf`` in decimals and the IRI formats checked (``_iri``)."""
    base = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    if base not in _DECIMAL:
        _DECIMAL[base] = jsonschema.validators.extend(
            base, {"multipleOf": _multiple_of}, format_checker=_format_checker(base))
    return _DECIMAL[base]


def listed(node: dict[str, Any], resolve: Callable[[str], Any]
           ) -> tuple[list[Any], dict[str, Any]] | None:
    """The values ``node`` lists, itself or in one of its ``allOf`` parts (a part may be a
    bare local ``$ref``), and the node without that list (what else a value must meet:
    checking a value against its own list would cost the list's length each); None when it
    lists none (an empty ``enum`` is the walker's error)."""
    parts = node.get("allOf")
    for i, part in enumerate([node, *(parts if isinstance(parts, list) else [])]):
        part = deref(part, resolve)
        if not isinstance(part, dict) or not ("const" in part or (
                isinstance(part.get("enum"), list) and part["enum"])):
            continue
        values = [part["const"]] if "const" in part else list(part["enum"])
        rest = {k: v for k, v in part.items() if k not in ("enum", "const")}
        if i == 0:
            return values, rest
        return values, {**node, "allOf": [rest if j == i - 1 else p
                                          for j, p in enumerate(node["allOf"])]}
    return None


# keywords whose value is a schema, a list of schemas, or a map of names to schemas
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
        "propertyNames", "additionalItems", "unevaluatedProperties", "unevaluatedItems")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "dependentSchemas", "dependencies")
MAX_CHECKED_NODES = 2_000  # subschemas a value check may visit, references followed


MAX_CHECKED_TEXT = 10_000  # characters of the listed values a regex may run over


def _linear(pattern: Any) -> bool:
    """A regex Python's ``re`` matches without backtracking blow-up: at most one
    quantifier, none on a group (``^(a+)+$`` on 40 characters takes hours)."""
    if not isinstance(pattern, str):
        return False
    quantifiers = re.findall(r"(?<!\\)(?:[*+?]|\{\d)", pattern)
    return len(quantifiers) <= 1 and not re.search(r"\)(?:[*+?]|\{\d)", pattern)


def _text_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_size(v) for v in value)
    if isinstance(value, dict):
        return sum(len(k) + _text_size(v) for k, v in value.items())
    return 0


def checkable(node: Any, resolve: Callable[[str], Any]) -> bool:
    """Whether the validator's work on ``node`` is bounded: at most ``MAX_CHECKED_NODES``
    subschemas with references followed (``anyOf`` of two references, twelve deep, is
    4,096), and every ``pattern`` (a request's own regex, run by Python's ``re``, which holds
    the GIL while it backtracks) one that cannot blow up (``_linear``)."""
    todo, seen = [node], 0
    while todo:
        item = todo.pop()
        seen += 1
        if seen > MAX_CHECKED_NODES:
            return False
        if not isinstance(item, dict):
            continue
        patterns = item.get("patternProperties")
        if ("pattern" in item and not _linear(item["pattern"])) or (
                "patternProperties" in item and not (isinstance(patterns, dict) and all(
                    _linear(p) for p in patterns))):
            return False
        if isinstance(item.get("$ref"), str):
            todo.append(resolve(item["$ref"]))
        for key in _ONE:
            todo.append(item.get(key))
        for key in _MANY:
            value = item.get(key)
            todo.extend(value if isinstance(value, list) else [value])
        for key in _MAP:
            value = item.get(key)
            todo.extend(value.values() if isinstance(value, dict) else [])
    return True


class ValueCheck:
    """Listed values checked against subschemas of one root schema."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._validator: Any = None

    def checker(self, subschema: Any) -> Callable[[Any], bool] | None:
        """``is_valid`` for ``subschema`` (a part of the root, its references resolved
        over the root); None when the validator cannot read the schema (a remote
        reference, a keyword of the wrong shape)."""
        try:
            if self._validator is None:
                cls = validator_class(self.root)
                self._validator = cls(self.root, format_checker=cls.FORMAT_CHECKER)
            is_valid = self._validator.evolve(schema=subschema).is_valid
        except Exception:  # jsonschema's errors
            return None

        def valid(value: Any) -> bool:
            return bool(is_valid(value))
        return valid

    def kept(self, values: list[Any], subschema: Any) -> list[Any] | None:
        """The ``values`` valid under ``subschema``; None when they cannot be checked."""
        valid = self.checker(subschema)
        if valid is None:
            return None
        try:
            return [v for v in values if valid(v)]
        except Exception:  # a reference or a pattern the validator cannot follow
            return None


def listed_schema(node: dict[str, Any], check: ValueCheck, resolve: Callable[[str], Any],
                  where: str) -> dict[str, Any] | None:
    """A schema that lists its values (``listed``) as the values the whole of it allows,
    every keyword checked by the validator (``not``, ``if``, an ``allOf`` that cannot be
    merged ...), one ``type`` kept for the call markup that reads it; None where it lists
    none, more than ``ENUM_LIMIT``, or where the check is not bounded (``checkable``) or
    cannot be made."""
    found = listed(node, resolve)
    if found is None or len(found[0]) > ENUM_LIMIT or not checkable(node, resolve) or \
            _text_size(found[0]) > MAX_CHECKED_TEXT:
        return None
    kept = check.kept(*found)
    if kept is None:
        return None
    if not kept:
        raise Unsatisfiable(f"{where}: no listed value matches the schema")
    out: dict[str, Any] = {"enum": kept} if len(kept) > 1 else {"const": kept[0]}
    if isinstance(node.get("type"), str):  # (a list of types the converter would write
        out["type"] = node["type"]         # before the values, ignoring them)
    return out
