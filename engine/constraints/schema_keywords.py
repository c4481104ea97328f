"""The validation keywords a grammar can hold only in some shapes (``not``,
``patternProperties``, ``propertyNames``, ``dependentRequired``, ``minProperties`` ...) and
numeric ones (bounds, ``multipleOf``), rewritten into what the converter writes exactly, or
left for the caller to relax or refuse. Pure Python; mixed into ``json_schema``'s walker,
which supplies ``walk``, ``loose`` and ``strict``."""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from engine.constraints.schema_merge import Reading, deref, value_key
from engine.constraints.schema_numbers import decimal, int_bounds, number_bounds
from engine.constraints.schema_terms import (
    ANNOTATIONS,
    ANY_TYPES,
    ARRAY_ONLY,
    DISTINCT,
    DISTINCT_LIMIT,
    ENTRY_COUNT,
    ENUM_LIMIT,
    KEY_PATTERN,
    NUMERIC,
    OBJECT_ONLY,
    TYPES,
    SchemaError,
    Unsatisfiable,
)
from engine.constraints.schema_values import ValueCheck, listed_schema, same_draft

_DEPENDENCIES = ("dependentRequired", "dependencies", "dependentSchemas")


def _dependents(node: dict[str, Any]) -> dict[str, list[str]] | None:
    """The names each key needs beside it, from ``dependentRequired``, ``dependencies`` and
    ``dependentSchemas`` (a schema that says only ``required`` is those names); None when
    there is none, or one says more."""
    if not set(node) & set(_DEPENDENCIES):
        return None
    out: dict[str, list[str]] = {}
    for word in _DEPENDENCIES:
        deps = node.get(word, {})
        if not isinstance(deps, dict):
            return None
        for trigger, needs in deps.items():
            if word != "dependentRequired" and (needs is True or (isinstance(needs, dict) and
                                                set(needs) <= {"required", *ANNOTATIONS})):
                needs = needs.get("required", []) if isinstance(needs, dict) else []
            elif word == "dependentSchemas":
                return None
            if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
                return None
            out.setdefault(trigger, []).extend(needs)
    return out


class KeywordRules:
    """What the shape of a (sub)schema lets a grammar enforce exactly."""

    check: ValueCheck  # the walker's: listed values checked against the root's subschemas
    root: Any  # the walker's: the schema being walked
    reading: Reading  # the walker's: as the validator reads the root's draft

    def loose(self, where: str, what: str) -> None:
        raise NotImplementedError  # the walker's: relaxed, or refused under strict

    def target(self, ref: str) -> Any:
        raise NotImplementedError  # the walker's: a local reference's target

    def _special(self, node: dict[str, Any], where: str) -> dict[str, Any]:
        """The validation keywords of ``SPECIAL`` rewritten into what the converter reads,
        where the shape allows it exactly; those left stay for ``walk`` to report."""
        node = dict(node)
        node.pop(KEY_PATTERN, None)  # only _map_keys writes it
        node.pop(ENTRY_COUNT, None)  # only _entries writes it
        node.pop(DISTINCT, None)  # only _distinct writes it
        if node.get("items") is False and not (
                isinstance(node.get("prefixItems"), list) and self.reading.tuples):
            node = {**{k: v for k, v in node.items() if k != "items"}, "maxItems": 0}
        kinds = node.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if kinds and all(isinstance(k, str) and k in TYPES for k in kinds):
            # an object's keywords say nothing of a string, an array's nothing of an object
            for words, kind in ((OBJECT_ONLY, "object"), (ARRAY_ONLY, "array")):
                if kind not in kinds:
                    node = {k: v for k, v in node.items() if k not in words}
        raw_props = node.get("properties")
        props: dict[str, Any] = raw_props if isinstance(raw_props, dict) else {}
        closed = "properties" in node and node.get("additionalProperties") in (None, False)
        if node.get("uniqueItems") is False or (node.get("uniqueItems") is True and \
                isinstance(node.get("maxItems"), int) and node["maxItems"] <= 1):
            node.pop("uniqueItems")
        if node.get("uniqueItems") is True:
            node = self._distinct(node, where)
        required: list[Any] = node["required"] if isinstance(node.get("required"), list) \
            else []
        missing = [n for n in required if isinstance(n, str) and n not in props]
        if missing and raw_props is None and node.get("additionalProperties") is False and \
                "patternProperties" not in node and node.get("type") in (None, "object"):
            # (the grammar writes such a node as an object: one with no key)
            raise Unsatisfiable(f"{where}.required: {missing[0]!r} is required but not "
                                "allowed (additionalProperties is false)")
        if isinstance(raw_props, dict) and missing:  # the converter writes only declared
            # properties (`"properties": {}` too: it wrote `{}` for a required name)
            extra = node.get("additionalProperties")
            if extra is False:
                raise Unsatisfiable(f"{where}.required: {missing[0]!r} is required but not "
                                  "allowed (additionalProperties is false)")
            props = {**props, **{n: extra if isinstance(extra, dict) else True
                                 for n in missing}}
            node["properties"] = props
        low, high = node.get("minProperties"), node.get("maxProperties")
        optional = [n for n in props if n not in required]
        if isinstance(low, int) and not isinstance(low, bool) and (
                len(set(required)) >= low or (closed and props and len(props) >= low)):
            # a closed object: its first optional properties made required (a subset)
            required = [*required, *optional[:max(low - len(set(required)), 0)]]
            node["required"] = required
            node.pop("minProperties")
        if isinstance(high, int) and not isinstance(high, bool) and closed and props and \
                len(set(required)) <= high:
            # the optional properties past the count left out (a subset)
            room = high - len(set(required))
            keep = set(required) | set([n for n in props if n not in required][:room])
            node["properties"] = props = {n: v for n, v in props.items() if n in keep}
            node.pop("maxProperties")
        deps = _dependents(node)
        live = {t: v for t, v in (deps or {}).items() if t in props or not closed}
        if deps is not None and props and all(set(v) <= set(props) for v in live.values()):
            # every dependent made required (a subset of what the schema allows); a key a
            # closed object never writes needs nothing
            node["required"] = list(dict.fromkeys(
                [*required, *(n for v in live.values() for n in v)]))
            for word in _DEPENDENCIES:
                node.pop(word, None)
        if closed and props:
            node = self._names(node, props, where)
        elif node.get("additionalProperties") is False and not props:
            node = self._map_keys(node)
        elif isinstance(node.get("patternProperties"), dict) and \
                node.get("additionalProperties") is not False:
            node = self._open_patterns(node, props)
        if not props and "propertyNames" in node and "patternProperties" not in node:
            node = self._map_names(node)
        if not node.get("properties"):
            node = self._entries(node, where)
        negated = node.get("not")
        if isinstance(negated, dict) and set(negated) == {"type"}:
            out_types = negated["type"] if isinstance(negated["type"], list) \
                else [negated["type"]]
            have = node.get("type", list(ANY_TYPES))
            have = have if isinstance(have, list) else [have]
            kept = [t for t in have if t not in out_types and
                    not (t == "integer" and "number" in out_types)]
            # a number that is not an integer cannot be written as types
            if not ("number" in kept and "integer" in out_types):
                if not kept:
                    raise Unsatisfiable(f"{where}.not: no type is left")
                node["type"] = kept
                node.pop("not")
        return self._not_required(node, where) if "not" in node else node

    def _not_required(self, node: dict[str, Any], where: str) -> dict[str, Any]:
        """``not`` of nothing (``{}``: no value is allowed; ``false``: says nothing), and
        ``not: {"required": [...]}`` of an object written alone (one type, not nullable)
        and closed (its declared properties only): one of those names is never written
        (one it does not require left out of its properties; a subset)."""
        negated = node["not"]
        if isinstance(negated, dict) and not same_draft(self.root, negated):
            return node  # (read in its own draft: the walk refuses or records it)
        if negated is False:
            return {k: v for k, v in node.items() if k != "not"}
        if negated is True or (isinstance(negated, dict) and not set(negated) - ANNOTATIONS):
            raise Unsatisfiable(f"{where}.not: no value is allowed")
        names = negated.get("required") if isinstance(negated, dict) else None
        props = node.get("properties")
        closed = node.get("additionalProperties") in (None, False) and not set(node) & {
            KEY_PATTERN, ENTRY_COUNT, "patternProperties", "propertyNames"}
        if not (closed and isinstance(props, dict) and isinstance(names, list) and
                node.get("type", "object") == "object" and node.get("nullable") is not True and
                set(negated) - ANNOTATIONS == {"required"} and
                all(isinstance(n, str) for n in names)):
            return node
        if not names:  # every value holds no names
            raise Unsatisfiable(f"{where}.not: no value is allowed")
        found = node.get("required")
        needed: list[Any] = found if isinstance(found, list) else []
        left = next((n for n in reversed(names) if n not in props), None) or next(
            (n for n in reversed(names) if n not in needed), None)
        if left is None:
            raise Unsatisfiable(f"{where}.not: every name it refuses together is required")
        return {**{k: v for k, v in node.items() if k != "not"},
                "properties": {n: v for n, v in props.items() if n != left}}

    @staticmethod
    def _open_patterns(node: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
        """``patternProperties`` of an object open to other keys: a declared property a
        pattern matches also under that pattern's schema, and every other key's value
        under every pattern's schema (and ``additionalProperties``'), whatever its name:
        a subset of what the schema allows."""
        patterns = node["patternProperties"]
        try:
            matchers = [(re.compile(p), v) for p, v in patterns.items()]
        except (re.error, TypeError):
            return node
        if not matchers:
            return {k: v for k, v in node.items() if k != "patternProperties"}
        node = {k: v for k, v in node.items() if k != "patternProperties"}
        if props:
            node["properties"] = {n: {"allOf": [s, *(v for m, v in matchers if m.search(n))]}
                                  if any(m.search(n) for m, _ in matchers) else s
                                  for n, s in props.items()}
        extra = node.get("additionalProperties")
        values = [v for _, v in matchers] + ([extra] if isinstance(extra, dict) else [])
        node["additionalProperties"] = values[0] if len(values) == 1 else {"allOf": values}
        return node

    @staticmethod
    def _map_keys(node: dict[str, Any]) -> dict[str, Any]:
        """A map: no declared property, ``additionalProperties: false``, its keys the
        ``patternProperties`` (all of one schema): any number of keys matching the patterns
        (``KEY_PATTERN``: each pattern made JSON-safe and checked as a ``pattern`` is, then
        their union), each value under that schema."""
        patterns = node.get("patternProperties")
        if not isinstance(patterns, dict) or not patterns or node.get("required") or \
                "propertyNames" in node:  # (its counts: _entries)
            return node
        schemas = list(patterns.values())
        if any(value_key(s) != value_key(schemas[0]) for s in schemas[1:]) or \
                not all(isinstance(p, str) and p for p in patterns):
            return node  # a key two patterns match needs both schemas
        if schemas[0] is False:  # no key may match: no key at all
            return {k: v for k, v in node.items() if k != "patternProperties"}
        node = {k: v for k, v in node.items() if k != "patternProperties"}
        if schemas[0] is True:
            schemas[0] = {}  # (walked as any value; `true` would be dropped as "any key")
        # the patterns, each checked alone (json_schema.walk) before their union is made
        return {**node, "additionalProperties": schemas[0], KEY_PATTERN: list(patterns)}

    def _distinct(self, node: dict[str, Any], where: str) -> dict[str, Any]:
        """``uniqueItems`` of an array whose items list their values (``enum``, ``const``;
        each checked against the rest of the items' schema): each value at most once, in
        the order listed (``DISTINCT``; a subset: the same values in another order are
        not written), with at most one item required and no cap under their number."""
        items = deref(node.get("items"), self.target)
        low, high = node.get("minItems", 0), node.get("maxItems")
        if not isinstance(items, dict) or node.get("type", "array") != "array" or set(node) & {
                "prefixItems", "contains", "minContains", "maxContains", "unevaluatedItems",
                "anyOf", "oneOf", "allOf", "not", "if", "$ref", "enum", "const"} or \
                type(low) is not int or low > 1 or not same_draft(self.root, items):
            return node  # (items of another draft: read in it, refused by the walk)
        try:
            found = listed_schema(items, self.check, self.target, f"{where}.items")
        except Unsatisfiable:  # no item at all: the walk says so
            return node
        if found is None:
            return node
        values: dict[Any, Any] = {}  # (1 and 1.0 are one value: the first kept)
        for v in found.get("enum", [found.get("const")]):
            values.setdefault(value_key(v), v)
        if len(values) > DISTINCT_LIMIT or (high is not None and (
                type(high) is not int or high < len(values))):
            return node
        return {**{k: v for k, v in node.items() if k not in (
            "items", "uniqueItems", "minItems", "maxItems")}, "type": "array",
            DISTINCT: [list(values.values()), low]}

    def _map_names(self, node: dict[str, Any]) -> dict[str, Any]:
        """``propertyNames`` of a map (no declared property, its other keys open or under
        one schema): names of a string type say nothing; a ``pattern`` is the map's keys
        (``KEY_PATTERN``, checked as a pattern); listed names are the object's optional
        properties, each under the other keys' schema, and no other key."""
        names = deref(node.get("propertyNames"), self.target)
        extra = node.get("additionalProperties", True)
        if extra is False or not isinstance(names, dict) or node.get("required"):
            return node
        rest = {k: v for k, v in names.items() if k not in ANNOTATIONS}
        if rest.pop("type", "string") != "string":
            return node
        node = {k: v for k, v in node.items() if k != "propertyNames"}
        if not rest:  # every key is a string
            return node
        if set(rest) == {"pattern"} and isinstance(rest["pattern"], str) and rest["pattern"]:
            return {**node, "type": "object", "additionalProperties": {} if extra is True
                    else extra, KEY_PATTERN: [rest["pattern"]]}
        listed = rest.get("enum", [rest["const"]] if "const" in rest else None)
        if set(rest) <= {"enum", "const"} and isinstance(listed, list) and listed and \
                len(rest) == 1 and all(isinstance(n, str) for n in listed):
            return {**node, "type": "object", "properties": {
                n: {} if extra is True else extra for n in listed}, "additionalProperties": False}
        return {**node, "propertyNames": names}  # (left: refused under strict)

    @staticmethod
    def _entries(node: dict[str, Any], where: str) -> dict[str, Any]:
        """``minProperties`` (0 or 1) and ``maxProperties`` of a map, an object with no
        declared property (its other keys open, under a schema, or a map's patterns): the
        number of entries it writes (``ENTRY_COUNT``). A key written twice is one key, so
        at least two keys cannot be promised: that count is left (refused under strict)."""
        low, high = node.get("minProperties", 0), node.get("maxProperties")
        if not {"minProperties", "maxProperties"} & set(node) or node.get("type", "object") \
                != "object" or node.get("required") or set(node) & {
                "patternProperties", "propertyNames", "dependentRequired", "dependencies",
                "dependentSchemas", "unevaluatedProperties", "anyOf", "oneOf", "allOf",
                "$ref", "enum", "const", "not", "if", "items", "prefixItems"}:
            return node
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                   for n in (low, high if high is not None else 0)) or low > 1:
            return node
        node = {k: v for k, v in node.items()
                if k not in ("minProperties", "maxProperties", "required")}  # (required: [])
        extra = node.get("additionalProperties", True)
        if extra is False and KEY_PATTERN not in node:  # no key at all
            if low:
                raise Unsatisfiable(f"{where}.minProperties: no key is allowed")
            return node
        if high is not None and low > high:
            raise Unsatisfiable(f"{where}.minProperties: above maxProperties")
        if extra is True and "properties" in node and not low:
            return node  # written as its declared properties: none (a subset, as always)
        return {**node, "type": "object", "additionalProperties": {} if extra is True else extra,
                ENTRY_COUNT: [low, high]}

    def _names(self, node: dict[str, Any], props: dict[str, Any], where: str
               ) -> dict[str, Any]:
        """``patternProperties`` and ``propertyNames`` of a closed object: only its
        declared properties can appear, so each is checked here (a name that a pattern
        matches must also match that pattern's schema; a name ``propertyNames`` refuses
        is left out)."""
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict):
            props = dict(props)
            for pattern, schema in patterns.items():
                try:
                    matcher = re.compile(pattern)
                except (re.error, TypeError):
                    return node
                for name in props:
                    if matcher.search(name):
                        props[name] = {"allOf": [props[name], schema]}
            node = {**node, "properties": props}
            node.pop("patternProperties")
        names = node.get("propertyNames")
        if isinstance(names, (dict, bool)):
            try:
                check = jsonschema.Draft202012Validator(names)
                bad = {n for n in props if not check.is_valid(n)}
            except jsonschema.SchemaError:
                return node
            if bad & set(node.get("required") or []):
                raise SchemaError(f"{where}.propertyNames: refuses a required property")
            node = {**node, "properties": {n: s for n, s in node["properties"].items()
                                           if n not in bad}}
            node.pop("propertyNames")
        return node

    def _numbers(self, out: dict[str, Any], where: str) -> dict[str, Any]:
        """Numeric bounds checked to be writable (``engine.constraints.grammar``'s converter writes
        them from ``schema_numbers``); ``multipleOf`` of a power of ten as decimal
        places, of a whole number within small bounds as the listed multiples. Bounds with
        no type and nothing else make a number."""
        if not any(k in out for k in NUMERIC) or "enum" in out or "const" in out:
            return {k: v for k, v in out.items() if k not in NUMERIC} \
                if "enum" in out or "const" in out else out
        if "type" not in out and set(out) <= {*NUMERIC}:
            # bounds alone mean a number, as `properties` alone means an object (the
            # converter had no rule for a typeless bound: "Unrecognized schema")
            out = {**out, "type": "number"}
        step = out.get("multipleOf")
        if step is not None:
            out = self._multiple(out, step, where)
            if "enum" in out:
                return out
        kind_or_kinds = out.get("type")
        kinds = kind_or_kinds if isinstance(kind_or_kinds, list) else [kind_or_kinds]
        try:
            for kind in kinds:
                number_bounds({**out, "type": kind})
        except ValueError as exc:
            self.loose(f"{where}.minimum", f"numeric bounds: {exc}")
            return {k: v for k, v in out.items() if k not in NUMERIC and k != "$places"}
        return out

    def _multiple(self, out: dict[str, Any], step: Any, where: str) -> dict[str, Any]:
        """``multipleOf``: a power of ten as decimal places (1: an integer), a whole
        number within bounds of at most ``ENUM_LIMIT`` multiples as those multiples."""
        if not isinstance(step, (int, float)) or isinstance(step, bool) or step <= 0:
            raise SchemaError(f"{where}.multipleOf must be a number > 0")
        rest = {k: v for k, v in out.items() if k != "multipleOf"}
        kind = out.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if not {"number", "integer", None} & set(kinds):  # no number: nothing to narrow
            return rest
        d = decimal(step).normalize()
        _, digits, exponent = d.as_tuple()
        if kind is not None and digits == (1,) and isinstance(exponent, int) and exponent <= 0:
            if exponent < 0:  # decimal places (an integer is a multiple of them already)
                return rest if kind == "integer" else {**rest, "$places": -exponent}
            # 1: an integer, in a list of types too (it was dropped there: 100.5 passed)
            return {**rest, "type": list(dict.fromkeys(
                "integer" if k == "number" else k for k in kinds))
                if isinstance(kind, list) else "integer"}
        if d == d.to_integral_value() and out.get("type") in ("integer", "number"):
            lo, hi = int_bounds(out)
            k = int(d)
            if lo is not None and hi is not None and (hi - lo) // k <= ENUM_LIMIT:
                values = list(range(-(-lo // k) * k, hi + 1, k))
                if not values:
                    raise Unsatisfiable(f"{where}.multipleOf: no multiple within the bounds")
                return {**{x: v for x, v in rest.items() if x not in NUMERIC},
                        "enum": values}
        self.loose(f"{where}.multipleOf", f"multipleOf {step}")
        return rest
