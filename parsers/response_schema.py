"""Hugging Face response-parsing schemas: JSON Schema plus ``x-regex`` extensions.

``apply_schema(schema, text)`` follows Hugging Face's semantics: a property's
value comes from the parent's text through ``x-regex`` (the first group, or a dict
of named groups, or the whole match), ``x-regex-iterator`` (an array of matches),
``x-regex-key-value`` (an object from ``key``/``value`` named groups) and
``x-parser: "json"`` (or ``"python-calls"``: ``[f(a=1), g()]``, parsers/python_calls.py);
``x-regex`` beside an iterator narrows the text the iterator splits
(a family's section of calls); without any of them a property sees its parent's text (or,
when the parent is already an object, its own key). Then ``const``, type
coercion and ``required`` (a missing required property makes the object None).

``stream_layout(schema)`` reads the markers a streaming parser needs out of the
same regexes: where reasoning ends, and where a tool-call block starts and ends.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from re import _constants as sre_c  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from parsers import gemma4, json_text, python_calls


class SchemaError(ValueError):
    """The response schema itself is unusable (reported at start-up)."""


@cache
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise SchemaError(f"bad regex {pattern!r}: {exc}") from None


class MarkupText(str):
    """A value read from key/value call markup: the text as written, which is a bare
    string or a value's JSON, depending on how the family's grammar wrote it
    (``parsers.call_items.coerce_arguments``)."""

    __slots__ = ()


def _extract(schema: dict[str, Any], value: Any) -> Any:
    """The raw value of this node, before coercion (None: absent)."""
    if not isinstance(value, str):
        return value
    if "x-regex" in schema:  # narrows the text first (an iterator then splits what it found)
        m = _compile(schema["x-regex"]).search(value)
        if m is None:
            return None
        if m.re.groupindex:
            value = {k: v for k, v in m.groupdict().items() if v is not None}
        else:
            value = m.group(1) if m.re.groups else m.group(0)
    if "x-regex-iterator" in schema and isinstance(value, str):
        rx = _compile(schema["x-regex-iterator"])
        return [m.group(1) if rx.groups else m.group(0) for m in rx.finditer(value)] or None
    if "x-regex-key-value" in schema and isinstance(value, str):
        rx = _compile(schema["x-regex-key-value"])
        return {m.group("key"): MarkupText(m.group("value")) for m in rx.finditer(value)}
    return value


def _parse_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json_text.loads(value)
        except ValueError:
            return None
    return value


def apply_schema(schema: dict[str, Any], value: Any) -> Any:
    if "const" in schema:
        return schema["const"]
    raw = _extract(schema, value)
    if raw is None:
        return None
    parser = schema.get("x-parser")
    if parser in ("json", "gemma4-tool-call", "python-calls"):
        raw = _parse_json(raw) if parser == "json" else gemma4.parse_value(raw) \
            if parser == "gemma4-tool-call" else python_calls.parse_calls(raw) \
            if isinstance(raw, str) else None
        if raw is None:
            return None
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {}).values()
        if isinstance(raw, str) and not any(
                "const" in p or any(k.startswith("x-") for k in p) for p in props):
            raw = _parse_json(raw)  # an object given as JSON text (e.g. string arguments)
        return _object(schema, raw)
    if kind == "array":
        if not isinstance(raw, list):
            return None
        items = schema.get("items", {})
        out = [apply_schema(items, v) for v in raw]
        return [v for v in out if v is not None]
    return coerce(raw, kind)


def _object(schema: dict[str, Any], raw: Any) -> dict[str, Any] | None:
    props: dict[str, Any] = schema.get("properties", {})
    out: dict[str, Any] = {}
    if isinstance(raw, dict):
        if schema.get("additionalProperties", True) is not False:
            out.update({k: v for k, v in raw.items() if k not in props})
        for name, sub in props.items():
            has_rule = "const" in sub or any(k.startswith("x-regex") for k in sub)
            v = apply_schema(sub, raw.get(name) if not has_rule or name in raw else None)
            if v is not None:
                out[name] = v
    elif isinstance(raw, str):
        for name, sub in props.items():
            v = apply_schema(sub, raw)
            if v is not None:
                out[name] = v
    else:
        return None
    if any(name not in out for name in schema.get("required", [])):
        return None
    return out


def coerce(value: Any, kind: Any) -> Any:
    """JSON Schema type coercion of a (usually string) value; unknown → unchanged."""
    kinds = kind if isinstance(kind, list) else [kind]
    if isinstance(value, str):
        text = value.strip()
        for k in kinds:
            if k == "integer" and re.fullmatch(r"-?\d+", text):
                return int(text)
            if k == "number":
                try:
                    return float(text) if any(c in text for c in ".eE") else int(text)
                except ValueError:
                    continue
            if k == "boolean" and text.lower() in ("true", "false"):
                return text.lower() == "true"
            if k == "null" and text.lower() in ("null", "none"):
                return None
            if k in ("object", "array"):
                parsed = _parse_json(text)
                if isinstance(parsed, dict if k == "object" else list):
                    return parsed
        return value
    if "string" in kinds and not isinstance(value, str) and value is not None:
        return json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return value


# -- streaming layout ---------------------------------------------------------------------
@dataclass(frozen=True)
class StreamLayout:
    """Markers for incremental parsing; None where the schema has no such part."""

    reasoning_start: str | None = None  # an optional opener, e.g. "<think>"
    reasoning_end: str | None = None  # e.g. "</think>"
    call_start: str | None = None  # e.g. "<tool_call>"
    call_end: str | None = None  # e.g. "</tool_call>"
    call_regex: str | None = None  # the x-regex-iterator: applied to each whole block
    call_schema: dict[str, Any] | None = None  # items schema of tool_calls
    # the template family, when its markup needs more than the markers above: "harmony"
    # (gpt-oss's channels, parsers/harmony.py), "gemma4" (its call values, parsers/gemma4.py)
    family: str | None = None
    markers: tuple[str, ...] = ()  # more control tokens the parser must see as text
    # a section of calls (tool_calls' own x-regex): parsed whole once it closes, with the
    # tool_calls schema; block_end None: the section runs to the end of the answer
    block_start: str | None = None
    block_end: str | None = None
    calls_schema: dict[str, Any] | None = None
    name: str | None = None  # the built-in family (parsers/families.py); None: a config's
    shape: Any = None  # its parsers.call_shape.CallShape: how a forced call is written
    # content wrapped in markup of its own (Kimi K3's response section): an optional
    # opener right before content's group, and the closer its lookahead names first;
    # text after the closer is not content (only calls may follow)
    content_start: str | None = None
    content_end: str | None = None
    # markup the family's generation prompt ends with, which belongs to the answer
    # (Functionary 3.2's ">>>" before the first recipient): read as if the model wrote it;
    # the schema's "x-prompt-tail"
    prompt_tail: str | None = None


def _literal_runs(items: list[Any]) -> list[tuple[int, str]]:
    """(index of the item after the run, text) for each run of literals in a regex AST."""
    runs: list[tuple[int, str]] = []
    buf = ""
    for i, (op, arg) in enumerate(items):
        if op is sre_c.LITERAL:
            buf += chr(arg)
            continue
        if buf:
            runs.append((i, buf))
            buf = ""
    if buf:
        runs.append((len(items), buf))
    return runs


def _group_index(items: list[Any]) -> int | None:
    for i, (op, arg) in enumerate(items):
        if op is sre_c.SUBPATTERN and arg[0] is not None:
            return i
    return None


def _first_literal(items: list[Any]) -> str | None:
    """The first literal text of a node list, looking into lookaheads and alternations'
    first branch."""
    text = ""
    for op, arg in items:
        if op is sre_c.LITERAL:
            text += chr(arg)
        elif text:
            break
        elif op is sre_c.ASSERT:
            return _first_literal(list(arg[1]))
        elif op is sre_c.BRANCH:
            return _first_literal(list(arg[1][0]))
        elif op is sre_c.SUBPATTERN:
            return _first_literal(list(arg[3]))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and arg[0] == 0:
            continue  # optional whitespace and the like
        else:
            break
    return text.strip() or None


def _optional_literal(node: Any, strip: bool = True) -> str | None:
    op, arg = node
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and arg[0] == 0 and arg[1] == 1:
        inner = list(arg[2])
        if len(inner) == 1 and inner[0][0] is sre_c.SUBPATTERN:
            inner = list(inner[0][1][3])
        text = "".join(chr(a) for o, a in inner if o is sre_c.LITERAL)
        if len(text) == len(inner):
            return (text.strip() if strip else text) or None
    return None


def stream_layout(schema: dict[str, Any]) -> StreamLayout:
    props: dict[str, Any] = schema.get("properties", {})
    r_start = r_end = c_start = c_end = None
    call_regex: str | None = None
    call_schema: dict[str, Any] | None = None
    reasoning = props.get("reasoning_content", {})
    if "x-regex" in reasoning:
        items = list(sre_parse.parse(reasoning["x-regex"]))
        g = _group_index(items)
        if g is None:
            raise SchemaError("reasoning_content x-regex needs a capture group")
        r_end = _first_literal(items[g + 1 :])
        runs = _literal_runs(items[:g])  # a literal right before the group opens it
        if runs and runs[-1][0] == g and runs[-1][1].strip():
            r_start = runs[-1][1].strip()
        else:
            before = [_optional_literal(n) for n in items[:g]]
            r_start = next((t for t in reversed(before) if t), None)
        if r_end is None:
            raise SchemaError("cannot tell where reasoning ends from its x-regex")
    wrap = _content_wrapper(props.get("content", {}).get("x-regex"))
    tail = schema.get("x-prompt-tail")
    if tail is not None and not (isinstance(tail, str) and tail):
        raise SchemaError("x-prompt-tail must be a non-empty string")
    calls = props.get("tool_calls", {})
    if "x-regex" in calls:
        b_start, b_end = _section(calls["x-regex"])
        family, markers = _family(None, r_start, None)
        return StreamLayout(r_start, r_end, family=family, markers=markers,
                            block_start=b_start, block_end=b_end, calls_schema=calls,
                            content_start=wrap[0],
                            content_end=None if wrap[1] == b_start else wrap[1],
                            prompt_tail=tail)
    if "x-regex-iterator" in calls:
        call_regex = calls["x-regex-iterator"]
        items = list(sre_parse.parse(call_regex))
        g = _group_index(items)
        if g is None:
            raise SchemaError("tool_calls x-regex-iterator needs a capture group")
        c_start = _first_literal(items[:g])
        c_end = _first_literal(items[g + 1 :])
        inner = list(items[g][1][3])
        runs = _literal_runs(inner)
        if not c_start:  # the group holds the whole block, markers included (harmony)
            c_start = _first_literal(inner)
        if not c_end and runs and runs[-1][0] == len(inner):
            c_end = runs[-1][1].strip() or None  # the group ends with a literal
        if c_start in (None, "{", "["):  # no markup: bare JSON calls (Llama 3)
            return StreamLayout(r_start, r_end)
        if not c_start or not c_end:
            raise SchemaError("tool_calls x-regex-iterator needs literal start and end markers")
        call_schema = calls.get("items", {})
    family, markers = _family(call_regex, r_start, call_schema)
    return StreamLayout(r_start, r_end, c_start, c_end, call_regex, call_schema, family,
                        markers, content_start=wrap[0],
                        content_end=None if wrap[1] == c_start else wrap[1],
                        prompt_tail=tail)


def _content_wrapper(regex: str | None) -> tuple[str | None, str | None]:
    """(opener, closer) of content written inside markup of its own: an optional literal
    right before content's group, and the first literal of what follows it; (None, None)
    when content has no opener of its own."""
    if not regex:
        return None, None
    items = list(sre_parse.parse(regex))
    g = _group_index(items)
    if not g:
        return None, None
    opener = _optional_literal(items[g - 1], strip=False)  # (its line break too)
    if opener is None:
        return None, None
    return opener, _first_literal(items[g + 1:])


def _section(regex: str) -> tuple[str, str | None]:
    """Where a section of calls starts (the literal before its group, else the group's
    first) and ends (the literal after it; None: the end of the answer)."""
    items = list(sre_parse.parse(regex))
    g = _group_index(items)
    if g is None:
        raise SchemaError("tool_calls x-regex needs a capture group")
    runs = _literal_runs(items[:g])
    start = runs[-1][1].strip() if runs and runs[-1][0] == g else None
    start = start or _first_literal(list(items[g][1][3]))
    if not start:
        raise SchemaError("tool_calls x-regex needs a literal start marker")
    return start, _first_literal(items[g + 1:])


HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>")


def _family(call_regex: str | None, r_start: str | None, call_schema: dict[str, Any] | None
            ) -> tuple[str | None, tuple[str, ...]]:
    """Families whose markup the plain markers cannot describe."""
    if r_start == "<|channel|>analysis<|message|>" or "<\\|constrain\\|>" in (call_regex or ""):
        return "harmony", HARMONY_MARKERS
    args = (call_schema or {}).get("properties", {}).get("function", {})
    args = args.get("properties", {}).get("arguments", {}) if isinstance(args, dict) else {}
    if isinstance(args, dict) and args.get("x-parser") == "gemma4-tool-call":
        return "gemma4", (gemma4.QUOTE,)
    return None, ()
