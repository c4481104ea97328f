"""Tool calls from the objects a model writes: the item a family's call schema reads
(``{"name", "arguments"}``, OpenAI's ``function`` wrapper, Command R's ``tool_name`` /
``parameters``, Apertus' ``{NAME: arguments}``), a bare JSON answer that is only calls, and
arguments parsed as text coerced to the types the tool declares."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from parsers import json_text
from parsers.response_schema import MarkupText, coerce

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
Tools = dict[str, dict[str, Any]]  # offered tools by name -> their function object
# by tool name, how call markup's grammar wrote each declared parameter: True as JSON,
# False as bare text (engine.constraints.grammar.Grammar.markup_values)
MarkupValues = dict[str, dict[str, bool]]


def markup_values(written: Iterable[tuple[str, Iterable[tuple[str, bool]]]]) -> MarkupValues:
    """``MarkupValues`` from a grammar's record (pairs, as the frozen grammar keeps them)."""
    return {name: dict(pairs) for name, pairs in written}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as OpenAI clients expect
    complete: bool = True  # False: cut off (max_tokens) before the call was closed


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def read_call(item: Any, tools: Tools,
              markup_values: MarkupValues | None = None) -> ToolCall | None:
    """One parsed call item as a ``ToolCall`` (None: not a call); ``markup_values``: how
    call markup's grammar wrote each parameter (``coerce_arguments``)."""
    if not isinstance(item, dict):
        return None
    fn = item.get("function", item)
    if not isinstance(fn, dict):
        return None
    name = fn.get("name", fn.get("tool_name"))  # Command R's key
    args = fn.get("arguments", fn.get("parameters", {}))
    if name is None and len(fn) == 1:  # Apertus: {NAME: arguments}
        name, args = next(iter(fn.items()))
        if name not in tools:
            return None
    if not isinstance(name, str):
        return None
    if isinstance(args, str):
        try:
            args = json_text.loads(args) if args.strip() else {}
        except ValueError:
            return ToolCall(new_call_id(), name, json.dumps({"_raw": args}))
    if isinstance(args, dict):
        args = coerce_arguments(args, tools.get(name, {}).get("parameters"),
                                (markup_values or {}).get(name))
    return ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))


def read_bare_calls(text: str, tools: Tools) -> list[ToolCall] | None:
    """A whole answer that is only calls of offered tools (one JSON object or a list,
    optionally fenced); None if it is anything else."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        data = json_text.loads(body)
    except ValueError:
        return None
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not (isinstance(item, dict) and item.get("name") in tools
                and isinstance(item.get("arguments", item.get("parameters")), (dict, str))):
            return None
        call = read_call(item, tools)
        if call is None:
            return None
        calls.append(call)
    return calls or None


def coerce_arguments(args: dict[str, Any], parameters: Any,
                     as_json: dict[str, bool] | None = None) -> dict[str, Any]:
    """Values parsed as text take the types the tool declares. Where the call's grammar
    said how it wrote a parameter of key/value markup (``as_json``: True as JSON, False as
    bare text), a ``MarkupText`` value is read back the same way (a typeless
    ``enum: [1, 2]``, Pydantic's ``Optional[int]`` or a ``$ref`` are JSON); a parameter it
    did not declare (an open object's any key) is coerced to the declared type as
    before."""
    props = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    out = {}
    for key, value in args.items():
        spec = props.get(key)
        written = as_json.get(key) if as_json is not None else None
        if written is not None and isinstance(value, MarkupText):
            value = _as_written(str(value), written, spec)
        elif isinstance(spec, dict) and isinstance(value, str) and "type" in spec:
            value = coerce(value, spec["type"])
        out[key] = value
    return out


def _as_written(text: str, as_json: bool, spec: Any) -> Any:
    """A markup value the grammar wrote as JSON (else bare text). JSON that
    ``parsers.json_text`` refuses (a ``\u0000`` escape) is still read as JSON; text that
    is not JSON after all falls back to the declared type's coercion."""
    if not as_json:
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return coerce(text, spec["type"]) if isinstance(spec, dict) and "type" in spec else text
