"""Exact rewrites of JSON Schema keywords the grammar converter reads loosely.

Pure Python, used by ``engine.constraints.json_schema`` before conversion:

- ``merge``: two schemas that must both hold (``allOf``, or an ``anyOf`` branch with the
  keywords beside it) as one, where that can be written exactly; ``None`` where it cannot
  (two different patterns, two unions), ``UNSAT`` where nothing can satisfy both;
- ``disjoint``: whether no value can match two ``oneOf`` branches (then ``anyOf`` means the
  same);
- ``FORMATS``: ``format`` s as patterns a JSON string can hold as written, each a subset of
  what a validator accepts (a date's day within its month, February to the 28th).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from engine.constraints.lark_rules import CUSTOM_GRAMMAR
from engine.constraints.schema_terms import KEYWORDS

UNSAT: dict[str, Any] = {"$unsatisfiable": True}  # marker: no value matches
# what a merge compares besides the keywords: a draft, a base or an anchor, OpenAPI's
# `nullable` (read as a type), a custom tool's grammar; any other word says nothing of a
# value (annotations, definitions, a schema's own words: the first part's kept)
_COMPARED = {*KEYWORDS, "$schema", "$id", "$anchor", "$dynamicAnchor", "$recursiveAnchor",
             "$vocabulary", "nullable", CUSTOM_GRAMMAR}

_IP4 = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
# a DNS label of at most 49 characters with no two hyphens together (IDNA refuses "ab--c"),
# five at most: a name within the 253 characters a validator allows (a subset: a label of
# more than 25 characters needs hyphens, punycode's "xn--" is left out)
_LABEL = "[a-zA-Z0-9]([a-zA-Z0-9]|-[a-zA-Z0-9]){0,24}"
_DATE = ("[1-9][0-9]{3}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-"
         "(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))")
_TIME = ("([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]{1,6})?"
         "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
_H16 = "[0-9a-fA-F]{1,4}"
# RFC 4291's forms: eight groups, or fewer around one "::"
_IP6 = "|".join([f"({_H16}:){{7}}{_H16}", f"({_H16}:){{1,7}}:",
                 *(f"({_H16}:){{1,{7 - k}}}(:{_H16}){{1,{k}}}" for k in range(1, 7)),
                 f":((:{_H16}){{1,7}}|:)"])
# RFC 3986's URI: a scheme, an authority (user, host, port) or a path, a query, a fragment
_PCT = "%[0-9A-Fa-f]{2}"
_SUB = "!$&'()*+,;="  # (bare in a class: llama.cpp's grammar has no \( escape)
_PCHAR = f"([a-zA-Z0-9._~{_SUB}:@-]|{_PCT})"
_AUTHORITY = (f"(([a-zA-Z0-9._~{_SUB}:-]|{_PCT})*@)?([a-zA-Z0-9._~{_SUB}-]|{_PCT})*"
              "(:[0-9]{0,5})?")
# (RFC 3986's paths, "(/ segment)*" and the like, written flat: a path character or "/"
# repeated, the same strings, so a maxLength beside it caps one count, not two nested)
_URI = (f"[a-zA-Z][a-zA-Z0-9+.-]{{0,15}}:(//{_AUTHORITY}(/({_PCHAR}|/)*)?|/({_PCHAR}({_PCHAR}|/)*)?"
        f"|{_PCHAR}({_PCHAR}|/)*)?([?]({_PCHAR}|[/?])*)?(#({_PCHAR}|[/?])*)?")
_N = "[0-9]{1,4}"
_DUR_TIME = f"T({_N}H({_N}M({_N}S)?)?|{_N}M({_N}S)?|{_N}S)"
FORMATS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "uuid": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    "email": "^[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9-]{1,63}([.][a-zA-Z0-9-]{1,63})*[.][a-zA-Z]{2,6}$",
    "hostname": f"^{_LABEL}([.]{_LABEL}){{0,4}}$",
    "ipv4": f"^{_IP4}([.]{_IP4}){{3}}$",
    "ipv6": f"^({_IP6})$",
    "uri": f"^{_URI}$",
    # RFC 3339's durations (appendix A): years to days, and/or a time; or weeks
    "duration": f"^P(({_N}D|{_N}M({_N}D)?|{_N}Y({_N}M({_N}D)?)?)({_DUR_TIME})?|{_DUR_TIME}|{_N}W)$",
    # (a negated class keeps JSON's escaped characters out: FORMATS are not rewritten)
    "json-pointer": "^(/([^/~\"\\\\\\x00-\\x1F\\x7F]|~[01])*)*$",
}
for _alias, _of in (("host-name", "hostname"), ("idn-hostname", "hostname"),
                    ("idn-email", "email"), ("uri-reference", "uri"), ("iri", "uri"),
                    ("iri-reference", "uri"), ("ip-address", "ipv4")):
    FORMATS[_alias] = FORMATS[_of]
# formats a validator checks that no pattern here writes: not enforced
CHECKED_FORMATS = {"regex", "relative-json-pointer", "uri-template"}

_LOWER = ("minimum", "minLength", "minItems", "minProperties")
_UPPER = ("maximum", "maxLength", "maxItems", "maxProperties")
_NUMERIC_TYPES = {"integer", "number"}


def _types(schema: dict[str, Any]) -> set[str] | None:
    """The types ``schema`` names (None: none, or a ``type`` that is no list of names)."""
    t = schema.get("type")
    names: list[Any] = t if isinstance(t, list) else [t]
    return {str(n) for n in names} if t is not None and all(
        isinstance(n, str) for n in names) else None


def _intersect_types(a: Any, b: Any) -> list[str]:
    ta = set(a) if isinstance(a, list) else {a}
    tb = set(b) if isinstance(b, list) else {b}
    out = ta & tb
    if ("integer" in ta and "number" in tb) or ("number" in ta and "integer" in tb):
        out.add("integer")
    return sorted(out)


def value_key(value: Any) -> str:
    """``value`` as text equal for values JSON Schema calls equal (``1`` and ``1.0`` too:
    json.dumps tells them apart, and two branches listing them were taken as disjoint)."""
    return json.dumps(_whole(value), sort_keys=True)


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return value


def merge(a: Any, b: Any, resolve: Callable[[str], Any]) -> dict[str, Any] | None:
    """Both ``a`` and ``b`` as one schema; ``resolve`` gives a local ``$ref``'s target."""
    a, b = deref(a, resolve), deref(b, resolve)
    if a is None or b is None:
        return None
    if a is UNSAT or b is UNSAT or a is False or b is False:
        return UNSAT
    if a is True:
        return dict(b) if isinstance(b, dict) else {} if b is True else None
    if b is True:
        return dict(a) if isinstance(a, dict) else None
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None  # not a schema: walked (and refused) as it is
    if "$ref" in a or "$ref" in b:  # a recursive or nested reference: not merged here
        return None
    out, b = dict(a), dict(b)
    _closed_properties(out, b)
    _closed_properties(b, a)
    for key, value in b.items():
        if key not in out or value_key(out[key]) == value_key(value):
            out[key] = value
            continue
        if key not in _COMPARED:
            continue
        have = out[key]
        if key == "properties":
            out[key] = {**have, **{n: ({"allOf": [have[n], s]} if n in have else s)
                                   for n, s in value.items()}}
        elif key == "required":
            out[key] = list(dict.fromkeys([*have, *value]))
        elif key == "type":
            types = _intersect_types(have, value)
            if not types:
                return UNSAT
            out[key] = types if len(types) > 1 else types[0]
        elif key in _LOWER and _numbers(have, value):
            out[key] = max(have, value)
        elif key in _UPPER and _numbers(have, value):
            out[key] = min(have, value)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and _numbers(have, value):
            out[key] = max(have, value) if key == "exclusiveMinimum" else min(have, value)
        elif key in ("items", "additionalProperties") and isinstance(have, dict) and \
                isinstance(value, dict):
            out[key] = {"allOf": [have, value]}
        elif key == "additionalProperties" and False in (have, value):
            out[key] = False
        elif key == "enum" and isinstance(have, list) and isinstance(value, list):
            keep = {value_key(v) for v in value}
            out[key] = [v for v in have if value_key(v) in keep]
            if not out[key]:
                return UNSAT
        else:  # two different patterns, unions, consts ...: not written as one
            return None
    return out


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _closed_properties(target: dict[str, Any], other: Any) -> None:
    """Where ``other`` admits no property beyond its own (``additionalProperties: false``)
    or admits them under a schema, ``target``'s other properties are dropped or constrained
    by it (JSON Schema applies each side's rule to every property of the value)."""
    if not isinstance(other, dict):
        return
    rule = other.get("additionalProperties")
    props = target.get("properties")
    if rule is None or rule is True or not isinstance(props, dict):
        return
    own = set(other.get("properties") or {})
    if rule is False:
        dropped = set(props) - own
        target["properties"] = {n: s for n, s in props.items() if n in own}
        if dropped & set(target.get("required") or []):
            target["properties"] = {**target["properties"],
                                    **{n: False for n in dropped & set(target["required"])}}
    elif isinstance(rule, dict):
        target["properties"] = {n: (s if n in own else {"allOf": [s, rule]})
                                for n, s in props.items()}


def deref(schema: Any, resolve: Callable[[str], Any]) -> Any:
    """``schema`` with a bare reference (nothing but ``$ref`` and annotations beside it)
    followed, a few links; None past them."""
    for _ in range(8):
        if isinstance(schema, dict) and set(schema) - {"$ref", "title", "description"} == set() \
                and isinstance(schema.get("$ref"), str):
            schema = resolve(schema["$ref"])
        else:
            return schema
    return None


@dataclass(frozen=True)
class Reading:
    """How the validator reads the schemas of one root: through ``resolve`` (a local
    ``$ref``'s target), and as the root's draft has it. Up to draft 7 a ``$ref`` stands
    alone (keywords beside it are ignored) and draft 4 has no ``const``: a proof that no
    value matches two schemas must read them as the validator does, or it proves nothing."""

    resolve: Callable[[str], Any]
    refs_alone: bool = False
    const: bool = True
    tuples: bool = True  # prefixItems is a keyword (2020-12 on; before, items lists)

    @classmethod
    def of(cls, root: Any, resolve: Callable[[str], Any]) -> Reading:
        """As jsonschema reads ``root``: its draft from the exact ``$schema`` address
        (``https://json-schema.org/draft-07/schema#`` names none: 2020-12)."""
        draft = draft_of(root)
        return cls(resolve, refs_alone=draft in (3, 4, 6, 7), const=draft > 4,
                   tuples=draft == 2020)

    def node(self, schema: Any) -> Any:
        """``schema`` as the validator reads it: references followed (a few links), a
        reference's siblings and ``const`` dropped where the draft ignores them."""
        for _ in range(8):
            if isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and (
                    self.refs_alone or set(schema) <= {"$ref", "title", "description"}):
                schema = self.resolve(schema["$ref"])
                continue
            if isinstance(schema, dict) and not self.const and "const" in schema:
                schema = {k: v for k, v in schema.items() if k != "const"}
            return schema
        return None


def draft_of(root: Any) -> int:
    """The draft jsonschema reads ``root`` in (3, 4, 6, 7, 2019 or 2020), from its exact
    ``$schema`` address, 2020-12 when it names none it knows."""
    cls = jsonschema.validators.validator_for(root if isinstance(root, dict) else {},
                                              jsonschema.Draft202012Validator)
    return {jsonschema.Draft3Validator: 3, jsonschema.Draft4Validator: 4,
            jsonschema.Draft6Validator: 6, jsonschema.Draft7Validator: 7,
            jsonschema.Draft201909Validator: 2019}.get(cls, 2020)


PROOF_STEPS = 256  # schemas one disjointness proof may read: past them, "not disjoint"


def disjoint(a: Any, b: Any, reading: Reading | Callable[[str], Any]) -> bool:
    """Whether no value can match both ``a`` and ``b`` (raw schemas, read as ``reading``
    says; a bare resolver reads them as draft 2020-12 does): their types cannot meet, their
    values are listed and differ, or a property one requires has, in the other, a schema
    no value of its own can match. A proof reads at most ``PROOF_STEPS`` schemas (shared
    references can make the tree of properties and ``allOf`` parts exponential)."""
    read = reading if isinstance(reading, Reading) else Reading(reading)
    return _disjoint(a, b, read, 4, [PROOF_STEPS])


def _disjoint(a: Any, b: Any, read: Reading, depth: int, steps: list[int]) -> bool:
    steps[0] -= 1
    if steps[0] < 0:
        return False
    a, b = read.node(a), read.node(b)
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a is False or b is False
    ta, tb = _kinds(a, read, steps, depth), _kinds(b, read, steps, depth)
    if ta is not None and tb is not None and not _intersect_types(sorted(ta), sorted(tb)):
        return True
    va, vb = listed_keys(a, read, steps), listed_keys(b, read, steps)
    if va is not None and vb is not None and not va & vb:
        return True
    if {"string"} in (ta, tb) and isinstance(a.get("pattern"), str) and \
            isinstance(b.get("pattern"), str):  # (a pattern says nothing of a number)
        xa, xb = literal_start(a["pattern"]), literal_start(b["pattern"])
        if not (xa.startswith(xb) or xb.startswith(xa)):
            return True  # "^https?://" and "^\\./" start apart
    if depth <= 0:
        return False
    for one, other in ((a, b), (b, a)):  # a union: each of its branches apart from the other
        for word in ("anyOf", "oneOf"):
            branches = one.get(word)
            if isinstance(branches, list) and branches and all(
                    _disjoint(x, other, read, depth - 1, steps) for x in branches):
                return True
    if {"object"} not in (ta, tb):  # (properties say nothing of a string)
        return False
    (pa, ra), (pb, rb) = _fields(a, read, steps, depth), _fields(b, read, steps, depth)
    # a name one requires, whose schemas (its allOf parts' too: all must hold) meet none of
    # the other's for it
    return any(_disjoint(x, y, read, depth - 1, steps)
               for n in (ra | rb) & set(pa) & set(pb) for x in pa[n] for y in pb[n])


def literal_start(pattern: str) -> str:
    """The text every match of an anchored ``pattern`` starts with ("" when it is not
    anchored, or has alternatives): its characters up to the first that is not a plain
    one, less one a count follows."""
    if not pattern.startswith("^") or "|" in pattern:  # (an option may start elsewhere)
        return ""
    out, i = [], 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            c, i = pattern[i + 1], i + 1  # an escaped punctuation mark: itself
        elif c in ".[](){}|*+?^$\\":
            break
        if i + 1 < len(pattern) and pattern[i + 1] in "*?{":
            break  # (this character may be absent; "+" keeps one)
        out.append(c)
        i += 1
    return "".join(out)


def _fields(node: dict[str, Any], read: Reading, steps: list[int], depth: int
            ) -> tuple[dict[str, list[Any]], set[str]]:
    """The property schemas (each name's, all of which hold) and required names of
    ``node`` and of its ``allOf`` parts (``depth`` levels of them)."""
    props: dict[str, list[Any]] = {}
    required: set[str] = set()
    found = node.get("properties")
    for name, schema in (found.items() if isinstance(found, dict) else []):
        props.setdefault(name, []).append(schema)
    names = node.get("required")
    required |= {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()
    parts = node.get("allOf")
    for part in parts if isinstance(parts, list) and depth > 0 else []:
        steps[0] -= 1
        part = read.node(part)
        if isinstance(part, dict) and steps[0] >= 0:
            more, names = _fields(part, read, steps, depth - 1)
            for name, schemas in more.items():
                props.setdefault(name, []).extend(schemas)
            required |= names
    return props, required


def _kinds(node: dict[str, Any], read: Reading, steps: list[int], depth: int
           ) -> set[str] | None:
    """Types every value valid under ``node`` has one of (None: any): its ``type``, the
    types of the values it lists, its ``allOf`` parts' (``depth`` levels of them), in
    common; a superset where anything else narrows them (a proof on it stays sound)."""
    found = _types(node)
    values = node.get("enum") if isinstance(node.get("enum"), list) else \
        [node["const"]] if "const" in node else None
    sets: list[set[str] | None] = [] if values is None else [{_kind(v) for v in values}]
    parts = node.get("allOf")
    for part in parts if isinstance(parts, list) and depth > 0 else []:
        steps[0] -= 1
        part = read.node(part)
        if isinstance(part, dict) and steps[0] >= 0:
            sets.append(_kinds(part, read, steps, depth - 1))
    for more in sets:
        if more is not None:
            found = more if found is None else set(_intersect_types(sorted(found),
                                                                    sorted(more)))
    return found


def _kind(value: Any) -> str:
    """A JSON value's type (an integral number an integer: it is one from draft 6 on, and
    an integer meets a number where types are intersected)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else "boolean"
    if isinstance(value, (int, float)):
        return "integer" if isinstance(value, int) or value.is_integer() else "number"
    return "string" if isinstance(value, str) else "array" if isinstance(value, list) \
        else "object"


def listed_keys(schema: Any, read: Reading, steps: list[int] | None = None,
                depth: int = 4) -> set[str] | None:
    """The values ``schema`` lists (``value_key`` texts), its ``allOf`` parts' (``depth``
    levels of them, within ``steps``) in common; None when it lists none."""
    steps = [PROOF_STEPS] if steps is None else steps
    steps[0] -= 1
    node = read.node(schema)
    if not isinstance(node, dict) or steps[0] < 0:
        return None
    found: set[str] | None = None
    if "const" in node:
        found = {value_key(node["const"])}
    elif isinstance(node.get("enum"), list):
        found = {value_key(v) for v in node["enum"]}
    parts = node.get("allOf")
    for part in parts if isinstance(parts, list) and depth > 0 else []:
        more = listed_keys(part, read, steps, depth - 1)
        if more is not None:
            found = more if found is None else found & more
    return found
