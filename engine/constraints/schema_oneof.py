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
  property the other does not allow is made required; else its first property whose
  values the other's schema for it cannot take (a discriminator neither requires).

A branch that cannot be kept apart from every other is not written (``None`` in its place);
the caller refuses, relaxes, or writes the rest. Pure Python.
"""

from __future__ import annotations

from typing import Any

from engine.constraints.schema_merge import Reading, deref, disjoint, listed_keys

MAX_BRANCHES = 64  # the branches are compared pairwise
# keywords that decide a value's validity beyond its declared properties and required names
_UNREAD = {"anyOf", "oneOf", "allOf", "$ref", "enum", "const", "not", "if", "then", "else",
           "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
           "dependencies", "minProperties", "maxProperties", "unevaluatedProperties"}


def all_disjoint(branches: list[Any], read: Reading) -> bool:
    """Whether no value can match two of ``branches`` (``disjoint``, pairwise); past
    ``MAX_BRANCHES``, only where each lists its values and no value twice (a ``oneOf`` of
    a thousand ``const`` s: pairwise proofs would take seconds)."""
    if len(branches) <= MAX_BRANCHES:
        return all(disjoint(x, y, read) for i, x in enumerate(branches)
                   for y in branches[i + 1:])
    seen: set[str] = set()
    for branch in branches:
        keys = listed_keys(branch, read)
        if keys is None or keys & seen:
            return False
        seen |= keys
    return True


def exclusive(gens: list[Any], raws: list[Any], read: Reading, strict: bool
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
            if gen is not None and not excluded(gen, other, read, strict):
                gen, narrowed = _narrowed(gen, other, read, strict), True
        # narrowing only takes values away: what was kept apart stays apart (checked)
        if gen is not None and narrowed and \
                not all(excluded(gen, o, read, strict) for o in others):
            gen = None
        out.append(gen)
    return out


def excluded(gen: Any, other: Any, read: Reading, strict: bool) -> bool:
    """Whether nothing the grammar writes for ``gen`` is valid under ``other``."""
    if disjoint(gen, other, read):
        return True
    parts, raw = _object(gen, read, strict), read.node(other)
    if parts is None or not isinstance(raw, dict):
        return False
    props, required, closed = parts
    if closed and _required(raw, read) - (set(props) | required):
        return True  # other needs a name this object never writes
    allowed = _allowed(raw)
    if allowed is not None and required - allowed:
        return True  # this object always writes a name other does not allow
    found = raw.get("properties")
    theirs: dict[str, Any] = found if isinstance(found, dict) else {}
    return any(name in theirs and _apart(props.get(name), theirs[name], read)
               for name in required)


def _narrowed(gen: Any, other: Any, read: Reading, strict: bool) -> Any | None:
    """``gen`` narrowed so that nothing it writes is valid under ``other``; None if no
    narrowing here does it."""
    parts, raw = _object(gen, read, strict), read.node(other)
    if parts is None or not isinstance(raw, dict) or not parts[2]:
        return None
    props, required, _ = parts
    node = dict(deref(gen, read.resolve))
    missing = _required(raw, read) - required
    if missing:  # leave out a name other requires: nothing written here has them all
        node["properties"] = {n: s for n, s in props.items() if n not in missing}
        return node
    allowed = _allowed(raw)
    extra = [n for n, schema in props.items() if allowed is not None and n not in allowed
             and schema is not False]
    found = raw.get("properties")
    theirs: dict[str, Any] = found if isinstance(found, dict) else {}
    # always write a name other does not allow, or one whose values other's cannot take
    # (a discriminator neither requires: {"type": {"enum": ["a"]}} against ["b"])
    apart = extra or [n for n, schema in props.items() if n in theirs and n not in required
                      and schema is not False and _apart(schema, theirs[n], read)]
    if apart:
        node["required"] = [*(node.get("required") or []), apart[0]]
        return node
    return None


def _object(schema: Any, read: Reading, strict: bool
            ) -> tuple[dict[str, Any], set[str], bool] | None:
    """(properties, required names, closed) of a schema the converter writes as an object
    of its declared properties only; None for any other."""
    node = deref(schema, read.resolve)  # (as the grammar writes it: siblings of a $ref apply)
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


def _required(raw: dict[str, Any], read: Reading) -> set[str]:
    """Names every value valid under ``raw`` holds (when it is an object)."""
    names = {n for n in raw.get("required") or [] if isinstance(n, str)}
    for part in raw.get("allOf") or []:
        part = read.node(part)
        if isinstance(part, dict):
            names |= {n for n in part.get("required") or [] if isinstance(n, str)}
    return names


def _allowed(raw: dict[str, Any]) -> set[str] | None:
    """The only names an object valid under ``raw`` may hold; None: any."""
    if raw.get("additionalProperties") is not False or "patternProperties" in raw:
        return None
    props = raw.get("properties")
    return set(props) if isinstance(props, dict) else set()


def _apart(mine: Any, theirs: Any, read: Reading) -> bool:
    """Whether no value matches both property schemas."""
    return mine is not None and disjoint(mine, theirs, read)
