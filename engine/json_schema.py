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
  ``REPEAT_LIMIT`` (``minLength``, ``maxLength``, ``minItems``, ``maxItems``, and ``{n,m}``
  inside a ``pattern``) is dropped, so that side of the count is unbounded, and an
  ``enum`` of more than ``ENUM_LIMIT`` values becomes the types of its values. Both give
  a superset of the schema. Claude Code, for one, sends ``"maxLength": 524288`` on a
  free-text field: written out as nested optional rules, that bound alone ran llama.cpp's
  grammar parser out of stack and killed the process.

Keywords the converter ignores (``minimum``, ``not``, ``patternProperties`` …) only
narrow a schema, so the grammar accepts a superset of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

ANY_TYPES = ["string", "number", "integer", "boolean", "object", "array", "null"]
TYPES = {*ANY_TYPES}
ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated",
               "readOnly", "writeOnly", "$schema", "$id", "$anchor", "discriminator",
               "strict", "$defs", "definitions", "nullable"}
SCHEMA_MAPS = ("properties",)  # name -> schema
COUNTS = ("minItems", "maxItems", "minLength", "maxLength")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_VALUES = ("items", "additionalProperties")
# llama.cpp sees a count n as n nested rules: past this it is not enforced (relaxed)
REPEAT_LIMIT = 1000
ENUM_LIMIT = 1000  # past this, an enum is relaxed to the types of its values
MAX_SCHEMA_NODES = 20_000  # subschemas in one schema, $ref targets counted once
# the converter's rules for optional properties grow with their square (and recurse)
MAX_OPTIONAL_PROPERTIES = 300


class SchemaError(ValueError):
    """A schema that cannot become a grammar; the message names the keyword."""


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


@dataclass
class SchemaSet:
    """Schemas sharing one ``$defs``; ``add`` returns the rewritten schema to convert
    (its refs point into ``defs``)."""

    defs: dict[str, Any] = field(default_factory=dict)
    relaxed: list[str] = field(default_factory=list)  # "where.keyword: what was relaxed"
    _count: int = 0

    def add(self, schema: Any, where: str = "schema") -> Any:
        scope = f"s{self._count}"
        self._count += 1
        try:
            return _Localizer(schema, scope, self, where).walk(schema, where)
        except RecursionError:
            raise SchemaError(f"{where}: the schema is nested too deeply") from None

    def root(self, schema: dict[str, Any]) -> dict[str, Any]:
        """``schema`` (from ``add``) with the shared ``$defs`` attached, for the converter."""
        if not self.defs:
            return schema
        if "$ref" in schema:  # the converter reads no sibling of a $ref, $defs included
            return {"$defs": self.defs, "anyOf": [schema]}
        return {**schema, "$defs": self.defs}


class _Localizer:
    def __init__(self, root: Any, scope: str, owner: SchemaSet, where: str) -> None:
        self.root, self.scope, self.where = root, scope, where
        self.defs, self.relaxed = owner.defs, owner.relaxed
        self.keys: dict[str, str] = {}  # original ref -> key in defs
        self.nodes = 0

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
            raise SchemaError(f"{where}: the schema has more than {MAX_SCHEMA_NODES} "
                              "subschemas")
        if node is True or node == {}:
            return {"type": list(ANY_TYPES)}
        if node is False:
            raise SchemaError(f"{where}: the schema 'false' allows no value")
        if not isinstance(node, dict):
            raise SchemaError(f"{where}: a schema must be an object or a boolean")
        if "$ref" in node:
            return {"$ref": f"#/$defs/{self.ref_key(node['$ref'], where)}"}
        out: dict[str, Any] = {}
        for key, value in node.items():
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
                out[key] = {k: self.walk(v, f"{where}.{key}.{k}") for k, v in value.items()}
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
                else:
                    out[key] = self.walk(value, f"{where}.{key}")
            elif key == "pattern":
                if not isinstance(value, str):
                    raise SchemaError(f"{where}.pattern must be a string")
                if value.startswith("^") and value.endswith("$"):
                    out[key], relaxed = relax_pattern(value)
                    self.relaxed.extend(f"{where}.pattern: {r}" for r in relaxed)
            elif key == "enum":
                if not isinstance(value, list) or not value:
                    raise SchemaError(f"{where}.enum must be a non-empty list")
                if len(value) > ENUM_LIMIT:
                    self.relaxed.append(f"{where}.enum: {len(value)} values, relaxed to "
                                        "their types")
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
            elif key == "format":
                if isinstance(value, str):
                    out[key] = value
            elif key in COUNTS:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise SchemaError(f"{where}.{key} must be a whole number >= 0")
                if value > REPEAT_LIMIT:
                    self.relaxed.append(f"{where}.{key}: {value} relaxed (unbounded)")
                else:
                    out[key] = value
            elif key == "const":
                out[key] = value
            # anything else only narrows the schema or is not a keyword: left out
        return self._types(node, out)

    @staticmethod
    def _types(node: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        if "allOf" in out and len(out["allOf"]) == 1:
            only = out.pop("allOf")[0]
            out = {**out, **only}
        types = out.get("type")
        if node.get("nullable") is True and types is not None:
            types = [*(types if isinstance(types, list) else [types]), "null"]
        if isinstance(types, list):
            rest = {k: v for k, v in out.items() if k != "type"}
            unique = list(dict.fromkeys(types))
            if len(unique) == 1:
                return {**rest, "type": unique[0]}
            if rest and not set(rest) & {"anyOf", "oneOf"}:
                return {"anyOf": [{**rest, "type": t} for t in unique]}
            out = {**out, "type": unique}
        return out or {"type": list(ANY_TYPES)}


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


_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}")


def relax_pattern(pattern: str) -> tuple[str, list[str]]:
    """``pattern`` with every ``{n,m}`` whose bound is above ``REPEAT_LIMIT`` relaxed: a
    large ``m`` is dropped (``{n,}``), a large ``n`` as well (``+`` or ``*``). Escapes and
    character classes are skipped as the converter reads them. Returns the pattern and
    what was relaxed."""
    out: list[str] = []
    relaxed: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        elif c == "[":  # to the first unescaped ']', as the converter reads a class
            j = i + 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            out.append(pattern[i:j + 1])
            i = j + 1
        elif c == "{" and (m := _QUANTIFIER.match(pattern, i)):
            low = int(m[1]) if m[1] else 0
            high = (int(m[3]) if m[3] else None) if m[2] else low
            if low > REPEAT_LIMIT or (high is not None and high > REPEAT_LIMIT):
                relaxed.append(f"{m[0]} relaxed")
                out.append(("+" if low else "*") if low > REPEAT_LIMIT or low <= 1
                           else f"{{{low},}}")
            else:
                out.append(m[0])
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out), relaxed
