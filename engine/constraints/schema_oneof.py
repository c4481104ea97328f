"""``oneOf`` branches a value could match twice, written so that no answer does.

A ``oneOf`` is valid for a value that matches exactly one branch. The grammar writes the
branches as alternatives (``anyOf``), which is exact only when no value it writes for one
branch is also valid under another. ``schema_merge.disjoint`` proves that for branches no
value can match together; many real schemas are not so: the branches differ in what they
require (``oneOf: [{"required": ["secret"]}, {"required": ["configMap"]}]`` beside the
object's properties, Glaive's ``calculate_area`` with one ``shape`` per branch), and an
object holding both names matches both.

What the grammar writes for a branch is narrower than what validates under it: an object
gets only its declared properties (an object that leaves out ``additionalProperties`` is
closed, see ``schema_converter``). ``exclusive`` uses that, branch by branch, against
each other branch *as the validator reads it* (the raw branch, without the keywords beside
the ``oneOf``):

- a name the other branch requires that this branch's object can never write, or a name
  this one requires that the other's closed object does not allow, or a property both
  declare with values no value matches twice: nothing written here matches there;
- else the branch is narrowed, a subset of what it allows: the names the other requires
  that this one does not are left out of its object; against a closed other, its first
  property the other does not allow is made required.

A branch that cannot be kept apart from every other is not written (``None`` in its place);
the caller refuses, relaxes, or writes the rest. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.constraints.schema_merge import disjoint, value_key

Resolve = Callable[[str], Any]
MAX_BRANCHES = 64  # the branches are compared pairwise
# keywords that decide a value's validity beyond its declared properties and required names
_UNREAD = {"anyOf", "oneOf", "allOf", "$ref", "enum", "const", "not", "if", "then", "else",
           "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
           "dependencies", "minProperties", "maxProperties", "unevaluatedProperties"}


def exclusive(gens: list[Any], raws: list[Any], resolve: Resolve, strict: bool
              ) -> list[Any | None]:
    """Each branch as the grammar should write it (``gens[i]``: the branch with the
    keywords beside the ``oneOf`` merged in), narrowed so that nothing it writes is valid
    under another raw branch (``raws``, as the validator reads them); None for a branch
    that cannot be kept apart."""
    if len(gens) > MAX_BRANCHES:
        return [None] * len(gens)
    out: list[Any | None] = []
    for i, gen in enumerate(gens):
        others = [r for j, r in enumerate(raws) if j != i]
        narrowed = False
        for other in others:
            if gen is not None and not excluded(gen, other, resolve, strict):
                gen, narrowed = _narrowed(gen, other, resolve, strict), True
        # narrowing only takes values away: what was kept apart stays apart (checked)
        if gen is not None and narrowed and \
                not all(excluded(gen, o, resolve, strict) for o in others):
            gen = None
        out.append(gen)
    return out


def excluded(gen: Any, other: Any, resolve: Resolve, strict: bool) -> bool:
    """Whether nothing the grammar writes for ``gen`` is valid under ``other``."""
    if disjoint(gen, other, resolve):
        return True
    parts, raw = _object(gen, resolve, strict), _deref(other, resolve)
    if parts is None or not isinstance(raw, dict):
        return False
    props, required, closed = parts
    if closed and _required(raw, resolve) - (set(props) | required):
        return True  # other needs a name this object never writes
    allowed = _allowed(raw)
    if allowed is not None and required - allowed:
        return True  # this object always writes a name other does not allow
    found = raw.get("properties")
    theirs: dict[str, Any] = found if isinstance(found, dict) else {}
    return any(name in theirs and _apart(props.get(name), theirs[name], resolve)
               for name in required)


def _narrowed(gen: Any, other: Any, resolve: Resolve, strict: bool) -> Any | None:
    """``gen`` narrowed so that nothing it writes is valid under ``other``; None if no
    narrowing here does it."""
    parts, raw = _object(gen, resolve, strict), _deref(other, resolve)
    if parts is None or not isinstance(raw, dict) or not parts[2]:
        return None
    props, required, _ = parts
    node = dict(_deref(gen, resolve))
    missing = _required(raw, resolve) - required
    if missing:  # leave out a name other requires: nothing written here has them all
        node["properties"] = {n: s for n, s in props.items() if n not in missing}
        return node
    allowed = _allowed(raw)
    extra = [n for n in props if allowed is not None and n not in allowed]
    if extra:  # always write a name other does not allow
        node["required"] = [*(node.get("required") or []), extra[0]]
        return node
    return None


def _object(schema: Any, resolve: Resolve, strict: bool
            ) -> tuple[dict[str, Any], set[str], bool] | None:
    """(properties, required names, closed) of a schema the converter writes as an object
    of its declared properties only; None for any other."""
    node = _deref(schema, resolve)
    if not isinstance(node, dict) or set(node) & _UNREAD:
        return None
    kind = node.get("type")
    if not (kind == "object" or (kind is None and ("properties" in node or "required" in node))):
        return None
    props, required = node.get("properties", {}), node.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list) or \
            not all(isinstance(n, str) for n in required):
        return None
    extra = node.get("additionalProperties")
    # an object without additionalProperties is closed when it has properties; one with
    # only `required` is closed under strict (json_schema._types); `{"type": "object"}`
    # is any object
    closed = extra is False or (extra is None and (
        "properties" in node or (strict and "required" in node)))
    if not closed and "properties" not in node and "required" not in node:
        return None
    return props, set(required), closed


def _required(raw: dict[str, Any], resolve: Resolve) -> set[str]:
    """Names every value valid under ``raw`` holds (when it is an object)."""
    names = {n for n in raw.get("required") or [] if isinstance(n, str)}
    for part in raw.get("allOf") or []:
        part = _deref(part, resolve)
        if isinstance(part, dict):
            names |= {n for n in part.get("required") or [] if isinstance(n, str)}
    return names


def _allowed(raw: dict[str, Any]) -> set[str] | None:
    """The only names an object valid under ``raw`` may hold; None: any."""
    if raw.get("additionalProperties") is not False or "patternProperties" in raw:
        return None
    props = raw.get("properties")
    return set(props) if isinstance(props, dict) else set()


def _apart(mine: Any, theirs: Any, resolve: Resolve) -> bool:
    """Whether no value matches both property schemas (``allOf`` read as all its parts)."""
    if mine is None:
        return False
    if disjoint(mine, theirs, resolve):
        return True
    a, b = _values(mine, resolve), _values(theirs, resolve)
    return a is not None and b is not None and not a & b


def _values(schema: Any, resolve: Resolve) -> set[str] | None:
    """The values a schema lists, an ``allOf``'s parts' in common; None: not listed."""
    node = _deref(schema, resolve)
    if not isinstance(node, dict):
        return None
    if "const" in node:
        found: set[str] | None = {value_key(node["const"])}
    elif isinstance(node.get("enum"), list):
        found = {value_key(v) for v in node["enum"]}
    else:
        found = None
    for part in node.get("allOf") or []:
        listed = _values(part, resolve)
        if listed is not None:
            found = listed if found is None else found & listed
    return found


def _deref(schema: Any, resolve: Resolve) -> Any:
    for _ in range(8):  # a chain of references, followed a few links
        if isinstance(schema, dict) and set(schema) <= {"$ref", "title", "description"} \
                and isinstance(schema.get("$ref"), str):
            schema = resolve(schema["$ref"])
        else:
            return schema
    return None
