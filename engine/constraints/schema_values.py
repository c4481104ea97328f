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

import importlib
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import jsonschema

from engine.constraints.schema_merge import deref, draft_of
from engine.constraints.schema_terms import ANNOTATIONS, ENUM_LIMIT, Unsatisfiable

try:
    from rfc3986_validator import validate_rfc3986
except ImportError:  # (a dependency; without it jsonschema checks no URI either)
    validate_rfc3986 = None

try:  # Python's own regex parser: what a pattern repeats, and inside what
    re_parser: Any = importlib.import_module("re._parser")
    re_constants: Any = importlib.import_module("re._constants")
except ImportError:  # Python 3.10
    re_parser = importlib.import_module("sre_parse")
    re_constants = importlib.import_module("sre_constants")
_REPEATS = {getattr(re_constants, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
            if hasattr(re_constants, n)}
_ONE_CHAR = {re_constants.LITERAL, re_constants.NOT_LITERAL, re_constants.IN, re_constants.ANY}
_BACKTRACKING = {getattr(re_constants, n) for n in (
    "BRANCH", "GROUPREF", "GROUPREF_EXISTS", "ASSERT", "ASSERT_NOT", "ATOMIC_GROUP")
    if hasattr(re_constants, n)}

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


def same_draft(root: Any, node: dict[str, Any]) -> bool:
    """Whether ``node`` is read in ``root``'s draft: jsonschema reads a subschema that names
    its own ``$schema`` in that draft (so a draft-4 subtree of a 2020-12 root calls 1.0 no
    integer), where this project reads every subschema as the root."""
    return not isinstance(node.get("$schema"), str) or draft_of(node) == draft_of(root)


def rebased_refs(root: Any) -> bool:
    """Whether a local ``$ref`` sits inside a subschema with its own base (``$id``, or
    draft 4's ``id``, naming a URI rather than a ``#`` anchor): the validator resolves it
    against that subschema, where this project resolves every reference from the root."""
    draft4 = draft_of(root) <= 4
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, inside = stack.pop()
        if isinstance(node, dict):
            base = node.get("id" if draft4 else "$id")
            inside = inside or (node is not root and isinstance(base, str) and
                                not base.startswith("#"))
            if inside and isinstance(node.get("$ref"), str):
                return True
            stack += [(v, inside) for v in node.values() if isinstance(v, (dict, list))]
        elif isinstance(node, list):
            stack += [(v, inside) for v in node if isinstance(v, (dict, list))]
    return False


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
        used = "const" if "const" in part else "enum"
        values = [part["const"]] if used == "const" else list(part["enum"])
        rest = {k: v for k, v in part.items() if k != used}
        if i == 0:
            return values, rest
        return values, {**node, "allOf": [rest if j == i - 1 else p
                                          for j, p in enumerate(node["allOf"])]}
    return None


# keywords whose value is a schema, a list of schemas, or a map of names to schemas
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
        "propertyNames", "additionalItems")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "dependentSchemas", "dependencies", "patternProperties")
# what the check does not follow, or runs in more than linear time (evaluated properties
# across every branch, exponential in their nesting)
_UNBOUNDED = ("$dynamicRef", "$recursiveRef", "unevaluatedProperties", "unevaluatedItems")
MAX_CHECKED_NODES = 2_000  # subschemas a value check may visit, references followed
# JSON nodes and characters of the listed values: a linear regex searched over a string of n
# characters still tries n starts (n squared steps), and uniqueItems compares items in pairs
MAX_CHECKED_SIZE = 2_000


def _linear(pattern: Any) -> bool:
    """A regex Python's ``re`` runs in about linear time per start: at most one repeat in
    all (``?``, ``*``, ``+``, ``{m,n}``), of a single character or class, and no
    alternation (``^(a+)+$`` on 40 characters takes hours; ``(a|a){,40}`` as long)."""
    if not isinstance(pattern, str):
        return False
    try:
        parsed = re_parser.parse(pattern)
    except Exception:  # (re.error, a count past re's limit, a recursion)
        return False
    repeats = 0
    todo = list(parsed)
    while todo:
        op, arg = todo.pop()
        if op in _REPEATS:
            repeats += 1
            body = list(arg[2])
            if len(body) != 1 or body[0][0] not in _ONE_CHAR:
                return False
        elif op in _BACKTRACKING:
            return False
        elif op == re_constants.SUBPATTERN:
            todo.extend(arg[-1])
    return repeats <= 1


def _size(value: Any) -> int:
    """JSON nodes and characters of ``value``."""
    if isinstance(value, str):
        return 1 + len(value)
    if isinstance(value, list):
        return 1 + sum(_size(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(1 + len(k) + _size(v) for k, v in value.items())
    return 1


def checkable(node: Any, resolve: Callable[[str], Any]) -> bool:
    """Whether the validator's work on ``node`` is bounded: at most ``MAX_CHECKED_NODES``
    subschemas with references followed (``anyOf`` of two references, twelve deep, is
    4,096), nothing it would follow unseen or evaluate across branches (``_UNBOUNDED``),
    and every regex (a request's own, run by Python's ``re``, which holds the GIL while it
    backtracks) one of ``_linear``'s."""
    todo, seen = [node], 0
    while todo:
        item = todo.pop()
        seen += 1
        if seen > MAX_CHECKED_NODES:
            return False
        if not isinstance(item, dict):
            continue
        patterns = item.get("patternProperties", {})
        if set(item) & set(_UNBOUNDED) or ("pattern" in item and not _linear(item["pattern"])) \
                or not isinstance(patterns, dict) or not all(_linear(p) for p in patterns):
            return False
        if isinstance(item.get("$ref"), str):
            todo.append(resolve(item["$ref"]))
        for key in _ONE:
            todo.append(item.get(key))
        for key in _MANY:
            value = item.get(key)
            todo.extend(value if isinstance(value, list) else [])
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
            if isinstance(subschema, dict) and "$schema" in subschema:
                # (a $schema makes evolve switch to jsonschema's own class of that draft,
                # which divides floats for multipleOf; the root's draft reads the rest)
                subschema = {k: v for k, v in subschema.items() if k != "$schema"}
            is_valid = self._validator.evolve(schema=subschema).is_valid
        except Exception:  # jsonschema's errors
            return None

        def valid(value: Any) -> bool:
            return bool(is_valid(value))
        return valid

    def typed(self, values: list[Any], kind: Any) -> list[Any] | None:
        """The ``values`` of type ``kind`` (a type or a list of them; None: any), as the
        root's draft reads types (1.0 is an integer from draft 6 on)."""
        kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
        if kinds is None:
            return list(values) if kind is None else None
        try:
            types = validator_class(self.root).TYPE_CHECKER
            return [v for v in values if any(types.is_type(v, k) for k in kinds)]
        except Exception:  # an unknown type name
            return None

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
    if found is None or len(found[0]) > ENUM_LIMIT:
        return None
    values, rest = found
    if set(rest) <= {"type"} | ANNOTATIONS:  # the type alone: jsonschema's own type check
        kept = check.typed(values, rest.get("type"))
    elif checkable(rest, resolve) and _size(values) <= MAX_CHECKED_SIZE:
        kept = check.kept(values, rest)
    else:
        return None
    if kept is None:
        return None
    if not kept:
        raise Unsatisfiable(f"{where}: no listed value matches the schema")
    out: dict[str, Any] = {"enum": kept} if len(kept) > 1 else {"const": kept[0]}
    if isinstance(node.get("type"), str):  # (a list of types the converter would write
        out["type"] = node["type"]         # before the values, ignoring them)
    return out
