"""JSON Schemas made ready for the GBNF converter, the same way for every use.

A tool's ``parameters``, a ``response_format`` schema and a Responses ``text.format``
schema all pass through ``SchemaSet.add`` before conversion. It copies the schema and

- points every local ``$ref`` (``#``, ``#/$defs/X``, ``#/definitions/X``, any JSON
  pointer into the schema) at an entry of one shared ``$defs`` with a name unique to
  this schema, so a schema keeps meaning the same thing when it is nested inside a
  wrapper (a tool call's ``arguments``), two tools may both define ``Address``, and
  recursive models (``$ref: "#"``) become recursive rules;
- drops annotations (``title``, ``description``, ``default``, ``examples`` …);
- rewrites what the converter reads differently from JSON Schema: ``{}`` and ``true``
  mean any value (not any object), a one-element ``allOf`` is its element, ``nullable``
  and type lists keep the other keywords per type, unanchored ``pattern`` s are left
  out (the grammar then allows any string: a superset, never a wrong refusal);
- refuses, naming the keyword and where it stands, what cannot be compiled at all:
  remote or dangling ``$ref`` s, unknown types, keywords of the wrong shape, schemas
  of more than ``MAX_SCHEMA_NODES`` subschemas, and objects of more than
  ``MAX_OPTIONAL_PROPERTIES`` optional properties (the converter's work grows with
  their square);
- relaxes what would make the grammar too large for llama.cpp: a count above
  ``REPEAT_LIMIT`` (``minLength``, ``minItems``, ``maxItems``, and ``{n,m}`` inside a
  ``pattern``) is dropped, so that side of the count is unbounded, and an ``enum`` of more
  than ``ENUM_LIMIT`` values becomes the types of its values. Both give a superset of the
  schema. A string's ``maxLength`` is kept: every grammar writer puts a long one in
  blocks (``schema_converter.counted``). Claude Code, for one, sends ``"maxLength":
  524288`` on a free-text field: written out as nested optional rules, that bound alone
  ran llama.cpp's grammar parser out of stack and killed the process.

Exactness. Numeric bounds (``schema_numbers``), patterns (``schema_patterns``, JSON-string
safe and anchored; lengths beside them: ``pattern_lengths``), formats
(``schema_merge.FORMATS``), ``allOf`` and the keywords beside an ``anyOf`` (merged),
``oneOf`` (branches no value can match twice, or written apart: ``schema_oneof``), listed
values beside any keyword (each checked by the validator: ``schema_values``), and the
object, map and array keywords ``schema_keywords`` rewrites are enforced exactly, or as a
subset. What is still not enforced (``if`` / ``then``, ``contains`` …, a relaxed count) is,
for a ``strict`` schema, a ``SchemaError`` naming the keyword and its path (OpenAI's strict
mode enforces a schema or refuses it); otherwise it is left out, recorded in
``SchemaSet.relaxed``, and the grammar accepts a superset of the schema.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from engine.constraints.lark_rules import CUSTOM_GRAMMAR
from engine.constraints.pattern_lengths import within_lengths
from engine.constraints.schema_keywords import KeywordRules
from engine.constraints.schema_merge import (
    CHECKED_FORMATS,
    FORMATS,
    UNSAT,
    Reading,
    merge,
)
from engine.constraints.schema_oneof import all_disjoint, exclusive
from engine.constraints.schema_patterns import (
    REPEAT_LIMIT,
    PatternError,
    json_string_pattern,
    python_regex,
    relax_pattern,
)
from engine.constraints.schema_terms import (
    ANNOTATIONS,
    ANY_TYPES,
    BY_TYPE,
    COUNTS,
    ENUM_LIMIT,
    KEY_PATTERN,
    KEYWORDS,
    MARKERS,
    MAX_OPTIONAL_PROPERTIES,
    MAX_SCHEMA_NODES,
    NUMERIC,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_VALUES,
    SPECIAL,
    TYPES,
    SchemaError,
    Unsatisfiable,
)
from engine.constraints.schema_values import ValueCheck, listed_schema, rebased_refs, same_draft

__all__ = ["ENUM_LIMIT", "MAX_SCHEMA_NODES", "REPEAT_LIMIT", "SchemaError", "SchemaSet",
           "Unsatisfiable", "relax_pattern"]


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


@dataclass
class SchemaSet:
    """Schemas sharing one ``$defs``; ``add`` returns the rewritten schema to convert
    (its refs point into ``defs``)."""

    defs: dict[str, Any] = field(default_factory=dict)
    relaxed: list[str] = field(default_factory=list)  # "where.keyword: what was relaxed"
    _count: int = 0

    def add(self, schema: Any, where: str = "schema", strict: bool = False) -> Any:
        """``schema`` rewritten for the converter; with ``strict``, what the grammar would
        not enforce exactly is a SchemaError instead of a relaxation."""
        scope = f"s{self._count}"
        self._count += 1
        walker = _Localizer(schema, scope, self, where, strict)
        if isinstance(schema, dict) and "draft-03" in str(schema.get("$schema", "")):
            walker.loose(f"{where}.$schema", "draft 3 (its divisibleBy, disallow, extends)")
        if rebased_refs(schema):  # (the walk resolves every reference from the root)
            walker.loose(f"{where}.$id", "a reference inside a subschema with its own $id")
        try:
            return walker.walk(schema, where)
        except RecursionError:
            raise SchemaError(f"{where}: the schema is nested too deeply") from None

    def root(self, schema: dict[str, Any]) -> dict[str, Any]:
        """``schema`` (from ``add``) with the shared ``$defs`` attached, for the converter."""
        if not self.defs:
            return schema
        if "$ref" in schema:  # the converter reads no sibling of a $ref, $defs included
            return {"$defs": self.defs, "anyOf": [schema]}
        return {**schema, "$defs": self.defs}


class _Localizer(KeywordRules):
    def __init__(self, root: Any, scope: str, owner: SchemaSet, where: str,
                 strict: bool = False) -> None:
        self.root, self.scope, self.where, self.strict = root, scope, where, strict
        self.defs, self.relaxed = owner.defs, owner.relaxed
        self.keys: dict[str, str] = {}  # original ref -> key in defs
        self.nodes = 0
        self.check = ValueCheck(root)
        self.reading = Reading.of(root, self.target)  # as the validator reads the root's draft

    def loose(self, where: str, what: str) -> None:
        """A keyword the grammar will not enforce: refused under strict, else recorded."""
        if self.strict:
            raise SchemaError(f"{where}: {what}, which strict mode cannot enforce exactly")
        self.relaxed.append(f"{where}: {what}")

    def target(self, ref: str) -> Any:
        """A local ``$ref``'s target in the original schema (None: not local or dangling)."""
        if not isinstance(ref, str) or not (ref in ("#", "#/") or ref.startswith("#/")):
            return None
        target = self.root
        for part in [_unescape(p) for p in ref[2:].split("/")] if ref.startswith("#/") else []:
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        return target

    def ref_key(self, ref: Any, where: str) -> str:
        if not isinstance(ref, str):
            raise SchemaError(f"{where}.$ref must be a string")
        if ref in self.keys:
            return self.keys[ref]
        if ref in ("#", "#/"):
            parts: list[str] = []
        elif ref.startswith("#/"):
            parts = [_unescape(p) for p in ref[2:].split("/")]
        else:
            raise SchemaError(f"{where}.$ref {ref!r}: only local references ('#/...') are "
                              "supported")
        target = self.root
        for part in parts:
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise SchemaError(f"{where}.$ref {ref!r} points at nothing in the schema")
        key = f"{self.scope}-d{len(self.keys)}"
        self.keys[ref] = key
        self.defs[key] = {}  # reserved first: a recursive ref finds its key
        self.defs[key] = self.walk(target, f"{self.where}{ref[1:].replace('/', '.')}")
        return key

    def walk(self, node: Any, where: str) -> Any:
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise SchemaError(f"{where}: the schema has more than {MAX_SCHEMA_NODES} subschemas")
        if node is True or node == {}:
            return {"type": list(ANY_TYPES)}
        if node is False or node is UNSAT:
            raise Unsatisfiable(f"{where}: the schema allows no value")
        if not isinstance(node, dict):
            raise SchemaError(f"{where}: a schema must be an object or a boolean")
        if node is not self.root and not same_draft(self.root, node):  # read by its own
            self.loose(f"{where}.$schema", "a draft other than the root's")
        if "$ref" in node:
            beside = {k: v for k, v in node.items() if k != "$ref" and k in KEYWORDS}
            if not beside:
                return {"$ref": f"#/$defs/{self.ref_key(node['$ref'], where)}"}
            # keywords beside a reference (draft 2019 on) hold with it: merged into its target
            merged = merge({"$ref": node["$ref"]}, beside, self.target)
            if merged is UNSAT:
                raise Unsatisfiable(f"{where}: no value matches the reference and the "
                                    "keywords beside it")
            if merged is None:
                self.loose(f"{where}.{next(iter(beside))}", "a keyword beside '$ref'")
                return {"$ref": f"#/$defs/{self.ref_key(node['$ref'], where)}"}
            node = merged
        values = listed_schema(node, self.check, self.target, where)
        if values is not None:
            return values
        node = self._combined(node, where)
        node = self._special(node, where)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == CUSTOM_GRAMMAR and isinstance(value, dict):
                out[key] = value  # a custom tool's own grammar (engine.constraints.lark_rules)
                continue
            if key in ANNOTATIONS or key.startswith("x-"):
                continue
            if key in SCHEMA_MAPS:
                if not isinstance(value, dict):
                    raise SchemaError(f"{where}.{key} must be an object of schemas")
                required = node.get("required")
                optional = len(set(value) - set(required if isinstance(required, list) else []))
                if optional > MAX_OPTIONAL_PROPERTIES:
                    raise SchemaError(f"{where}.{key}: {optional} optional properties, over the "
                                      f"limit of {MAX_OPTIONAL_PROPERTIES} for a grammar: "
                                      "list more of them in 'required' or split the object")
                out[key] = self._properties(value, required, f"{where}.{key}")
            elif key == "prefixItems" and not self.reading.tuples:
                continue  # no keyword in the root's draft: the validator reads none
            elif key in SCHEMA_LISTS:
                if not isinstance(value, list) or not value:
                    raise SchemaError(f"{where}.{key} must be a non-empty list of schemas")
                out[key] = [self.walk(v, f"{where}.{key}[{i}]") for i, v in enumerate(value)]
            elif key in SCHEMA_VALUES:
                if key == "additionalProperties" and isinstance(value, bool):
                    out[key] = value
                elif key == "items" and isinstance(value, list):  # draft 4 tuples
                    out["prefixItems"] = [self.walk(v, f"{where}.items[{i}]")
                                          for i, v in enumerate(value)]
                elif key == "items" and value is False:  # (no tuple: schema_keywords)
                    continue  # nothing after prefixItems: the converter writes none anyway
                elif key == "additionalProperties":
                    try:
                        out[key] = self.walk(value, f"{where}.{key}")
                    except Unsatisfiable:  # no other key can have a value: none allowed
                        out[key] = False
                else:
                    out[key] = self.walk(value, f"{where}.{key}")
            elif key == KEY_PATTERN:  # (schema_keywords._map_keys: each checked as a pattern)
                keys = [self._key_pattern(p, f"{where}.patternProperties") for p in value]
                if all(keys):  # their union; else (not strict: relaxed) keys of any name
                    out[key] = "^(" + "|".join(f"({k[1:-1]})" for k in keys) + ")$"
            elif key == "pattern":
                if not isinstance(value, str):
                    raise SchemaError(f"{where}.pattern must be a string")
                self._pattern(out, value, f"{where}.pattern")
            elif key == "enum":
                if not isinstance(value, list) or not value:
                    raise SchemaError(f"{where}.enum must be a non-empty list")
                if len(value) > ENUM_LIMIT:
                    self.loose(f"{where}.enum", f"{len(value)} values, relaxed to their types")
                    out["type"] = sorted({_json_type(v) for v in value})
                else:
                    out[key] = value
            elif key == "required":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise SchemaError(f"{where}.required must be a list of names")
                out[key] = value
            elif key == "type":
                types = value if isinstance(value, list) else [value]
                bad = [t for t in types if not isinstance(t, str) or t not in TYPES]
                if bad or not types:
                    raise SchemaError(f"{where}.type: unknown type {bad[0] if bad else value!r}")
                out[key] = value
            elif key == "format" and isinstance(value, str):
                out[key] = value
            elif key in COUNTS:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise SchemaError(f"{where}.{key} must be a whole number >= 0")
                if value <= REPEAT_LIMIT or key.endswith("Length"):  # (see _strings)
                    out[key] = value
                else:
                    self.loose(f"{where}.{key}", f"{value} relaxed (unbounded)")
            elif key in NUMERIC:
                draft4 = isinstance(value, bool) and key.startswith("exclusive")
                if draft4 and self.reading.const:  # (jsonschema compares it as 0 or 1)
                    self.loose(f"{where}.{key}", "a boolean, a flag in draft 4 only")
                if not draft4 and (not isinstance(value, (int, float)) or
                                   isinstance(value, bool) or not math.isfinite(value)):
                    raise SchemaError(f"{where}.{key} must be a finite number")
                out[key] = value
            elif key == "const" or key in MARKERS:  # (MARKERS: schema_keywords wrote them)
                out[key] = value
            elif key in SPECIAL:  # not enforced (what is, _special rewrote)
                self.loose(f"{where}.{key}", f"'{key}'")
            # anything else is not a keyword: left out
        for low, high in (("minLength", "maxLength"), ("minItems", "maxItems")):
            if out.get(low, 0) > out.get(high, out.get(low, 0)):
                raise Unsatisfiable(f"{where}.{low}: above {high}: the schema allows no value")
        out = self._values(node, out, where)
        out = self._strings(out, where)
        out = self._numbers(out, where)
        return self._types(node, out, where)

    def _properties(self, props: dict[str, Any], required: Any, where: str) -> dict[str, Any]:
        """Each property's schema; an optional one no value can match is left out (the
        object then never holds it), a required one makes the object unsatisfiable."""
        out = {}
        needed = set(required) if isinstance(required, list) else set()
        for name, schema in props.items():
            try:
                out[name] = self.walk(schema, f"{where}.{name}")
            except Unsatisfiable:
                if name in needed:
                    raise
        return out

    def _combined(self, node: dict[str, Any], where: str) -> dict[str, Any]:
        """``allOf`` merged into one schema, and the keywords beside an ``anyOf`` / ``oneOf``
        merged into each branch, where that is exact (``engine.constraints.schema_merge``); a
        ``oneOf`` whose branches cannot overlap read as ``anyOf``."""
        for _ in range(16):  # a part may hold an allOf of its own: merged in turn
            parts = node.get("allOf")
            if not isinstance(parts, list) or not parts:
                break
            merged: Any = {k: v for k, v in node.items() if k != "allOf"}
            for part in parts:
                merged = merge(merged, part, self.target) if merged is not None else None
            if merged is UNSAT:
                raise Unsatisfiable(f"{where}.allOf: no value can match every schema")
            if merged is None:
                self.loose(f"{where}.allOf", "schemas that cannot be merged into one")
                break
            node = merged
        union = "anyOf" if "anyOf" in node else "oneOf" if "oneOf" in node else None
        branches = node.get(union) if union else None
        if union is None or not isinstance(branches, list) or not branches:
            return node
        beside = {k: v for k, v in node.items() if k != union and k in KEYWORDS}
        if union == "oneOf" and "anyOf" in node:
            self.loose(f"{where}.oneOf", "'oneOf' beside 'anyOf'")
        overlap = union == "oneOf" and not all_disjoint(branches, self.reading)
        if not beside and not overlap:
            return node
        spread = [merge(beside, b, self.target) for b in branches] if beside else branches
        if any(x is None for x in spread):
            if overlap:
                self.loose(f"{where}.oneOf", "branches a value could match more than once")
            self.loose(f"{where}.{union}", "keywords beside it that cannot be merged into "
                       "its branches")
            return node
        pairs = [(b, x) for b, x in zip(branches, spread, strict=True) if x is not UNSAT]
        if not pairs:
            raise Unsatisfiable(f"{where}.{union}: no branch can match the keywords beside it")
        rest = {k: v for k, v in node.items() if k not in beside and k != union}
        kept = [x for _, x in pairs]
        if overlap:
            # (a branch no value beside the oneOf can match is none a written value matches)
            apart = exclusive(kept, [b for b, _ in pairs], self.reading, self.strict)
            if all(x is None for x in apart) or (None in apart and not self.strict):
                self.loose(f"{where}.oneOf", "branches a value could match more than once")
                return node if not beside else {**rest, union: kept}
            kept = [x for x in apart if x is not None]  # strict: a branch left out, a subset
        return {**rest, union: kept}

    def _key_pattern(self, pattern: str, where: str) -> str:
        """A map's key pattern made JSON-safe and anchored ("": relaxed, or refused)."""
        keys: dict[str, Any] = {}
        self._pattern(keys, pattern, where)
        anchored = str(keys.get("pattern", ""))
        return anchored if anchored.startswith("^") and anchored.endswith("$") else ""

    def _pattern(self, out: dict[str, Any], pattern: str, where: str) -> None:
        try:
            python_regex(pattern)  # (what the validator cannot read, it cannot check)
            anchored = json_string_pattern(pattern)
        except (re.error, PatternError) as exc:
            self.loose(where, f"pattern {pattern!r}: {exc}")
            return
        out["pattern"], relaxed = relax_pattern(anchored)
        for r in relaxed:
            self.loose(where, r)

    def _values(self, node: dict[str, Any], out: dict[str, Any], where: str
                ) -> dict[str, Any]:
        """``enum`` / ``const`` beside keywords they could not be checked against
        (``schema_values.listed_schema``; the converter writes the values alone): not
        exact."""
        if ("enum" in out or "const" in out) and any(
                k in KEYWORDS and k not in ("enum", "const") for k in node):
            self.loose(f"{where}.enum", "listed values beside keywords they cannot be "
                       "checked against")
        return out

    def _strings(self, out: dict[str, Any], where: str) -> dict[str, Any]:
        """``format`` as a pattern; the keywords the converter reads one at a time
        (a pattern, a format, a length) checked to come alone: lengths beside a pattern
        written into it where they can be (``engine.constraints.pattern_lengths``); a
        ``minLength`` past ``REPEAT_LIMIT`` left is relaxed."""
        fmt = out.get("format")
        if isinstance(fmt, str) and "enum" not in out and "const" not in out:
            if fmt in FORMATS:
                if "pattern" in out:
                    self.loose(f"{where}.format", f"format {fmt!r} beside a pattern")
                else:
                    out = {**out, "pattern": FORMATS[fmt]}
            elif fmt in CHECKED_FORMATS:
                self.loose(f"{where}.format", f"format {fmt!r}")
        out.pop("format", None)
        if "pattern" in out and ("minLength" in out or "maxLength" in out) and \
                _type_may_be(out, "string"):
            fitted = within_lengths(out["pattern"], out.get("minLength", 0),
                                    out.get("maxLength"))
            if fitted != out["pattern"] and not self.strict:
                fitted = None  # a capped pattern is a subset: not strict relaxes instead
            if fitted is None:
                self.loose(f"{where}.pattern", "a length beside a pattern")
            out = {k: v for k, v in out.items() if k not in ("minLength", "maxLength")}
            if fitted is not None:
                out["pattern"] = fitted
        if out.get("minLength", 0) > REPEAT_LIMIT:  # no pattern took it: a long maxLength
            # is written in blocks (schema_converter.long_repetition), a long minLength not
            self.loose(f"{where}.minLength", f"{out.pop('minLength')} relaxed (unbounded)")
        return out

    def _types(self, node: dict[str, Any], out: dict[str, Any], where: str) -> dict[str, Any]:
        if "allOf" in out and len(out["allOf"]) == 1:
            only = out.pop("allOf")[0]
            out = {**out, **only}
        elif "allOf" in out:  # not merged (and reported): the converter's object merge
            pass
        if out.get("additionalProperties") is True and "properties" not in out:
            del out["additionalProperties"]  # any other key: what an object allows anyway
        elif out.get("additionalProperties") is True:
            # any value (the converter writes `true` beside properties as objects only)
            out = {**out, "additionalProperties": {"type": list(ANY_TYPES)}}
        if "required" in out and "properties" not in out and out.get("type") in (
                None, "object") and not set(out) & {"anyOf", "oneOf", "allOf"} and \
                out.get("additionalProperties") is not False:
            # the converter's plain object ignores 'required': the names as properties
            # (strict: only those, so no other key can repeat one of them)
            extra = out.get("additionalProperties", True)
            value = extra if isinstance(extra, dict) else {"type": list(ANY_TYPES)}
            out = {**out, "type": "object",
                   "properties": {n: value for n in out["required"]},
                   "additionalProperties": False if self.strict else extra}
        if _type_may_be(out, "array") and "items" not in out and "prefixItems" not in out \
                and ("minItems" in out or "maxItems" in out):  # (the port's bare array: any)
            out = {**out, "items": {"type": list(ANY_TYPES)}}
        if "prefixItems" in out:
            # the converter writes the tuple alone (it reads 'items' first): the items
            # after it left out, a subset
            out.pop("items", None)
            n = len(out["prefixItems"])
            if out.get("minItems", 0) > n or out.get("maxItems", n) < n:
                self.loose(f"{where}.prefixItems", "item counts beside a tuple")
        types = out.get("type")
        if node.get("nullable") is True and types is not None:
            types = [*(types if isinstance(types, list) else [types]), "null"]
        if isinstance(types, list):
            rest = {k: v for k, v in out.items() if k != "type"}
            unique = list(dict.fromkeys(types))
            if len(unique) == 1:
                return {**rest, "type": unique[0]}
            if rest and not set(rest) & {"anyOf", "oneOf"}:
                return {"anyOf": [{**_for_type(rest, t), "type": t} for t in unique]}
            out = {**out, "type": unique}
        return out or {"type": list(ANY_TYPES)}


def _for_type(rest: dict[str, Any], t: str) -> dict[str, Any]:
    """The keywords of ``rest`` that apply to values of type ``t`` (a type list spread
    into one branch per type: a string's pattern is nothing to an integer)."""
    other = set().union(*(v for k, v in BY_TYPE.items() if k != t)) - BY_TYPE.get(t, set())
    return {k: v for k, v in rest.items() if k not in other}


def _type_may_be(out: dict[str, Any], t: str) -> bool:
    types = out.get("type")
    return types is None or t == types or (isinstance(types, list) and t in types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
