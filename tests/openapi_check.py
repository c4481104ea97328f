"""Check captured server traffic against OpenAI's OpenAPI description.

Every server the tests start writes what it sends to a capture directory
(``api/web/capture.py``). ``check_directory`` reads those files and validates each body on
an OpenAI route against the schema the description gives for that route, status and
content type: JSON bodies whole, each ``data:`` event of a stream, each WebSocket message
of ``/v1/responses``. Errors (4xx, 5xx) must be the description's ``ErrorResponse``.

The snapshot is ``tests/fixtures/openai-openapi.json.gz`` (``tests/openapi_snapshot.py``).
Allowances, where the live API sends what the description does not allow
(``LIVE_VALUES``): a property the description marks optional may be ``null``, OpenAPI
3.0's ``nullable`` left in this 3.1 description allows null, and a few fields the live API
fills differently (a stream chunk's ``finish_reason`` is null until the last chunk, base64
embeddings are strings, a streamed custom tool call's ``type`` is ``custom``).
"""

from __future__ import annotations

import copy
import gzip
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource

SNAPSHOT = Path(__file__).parent / "fixtures" / "openai-openapi.json.gz"
BASE = "urn:openai-openapi"
UNCHECKED = {"/files/{file_id}/content"}  # the file's own bytes, not JSON of the API
# Where the live API sends what its description does not allow: (schema, path with * for
# list items) -> the schema of what it sends there, added as an alternative.
NULL = {"type": "null"}
LIVE_VALUES: dict[tuple[str, str], dict[str, Any]] = {
    # a stream chunk's finish_reason until the last chunk
    ("CreateChatCompletionStreamResponse", "choices/*/finish_reason"): NULL,
    # a streamed custom tool call: the live API's shape ({"type": "custom", "custom": {"name",
    # "input"}}), which the description's chunk lacks (openai/openai-openapi issue #576)
    ("CreateChatCompletionStreamResponse", "choices/*/delta/tool_calls/*/type"):
        {"const": "custom"},
    # a completions stream chunk's finish_reason until the last chunk
    ("CreateCompletionResponse", "choices/*/finish_reason"): NULL,
    # echo: the first prompt token has no logprob
    ("CreateCompletionResponse", "choices/*/logprobs/token_logprobs/*"): NULL,
    ("CreateCompletionResponse", "choices/*/logprobs/top_logprobs/*"): NULL,
    # encoding_format "base64": the vector as a base64 string
    ("Embedding", "embedding"): {"type": "string"},
    # an empty page has no first or last id
    **{(name, key): NULL
       for name in ("ListFilesResponse", "ListBatchesResponse", "ResponseItemList",
                    "ConversationItemList") for key in ("first_id", "last_id")},
}


@dataclass
class Finding:
    """One body that breaks its schema."""
    route: str
    where: str
    message: str
    body: str


@dataclass
class Report:
    checked: Counter[str] = field(default_factory=Counter)
    invalid: list[Finding] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.checked.values())

    def summary(self, limit: int = 12) -> str:
        routes = ", ".join(f"{route} {n}" for route, n in sorted(self.checked.items()))
        lines = [f"API shape check: {self.total} bodies checked, {len(self.invalid)} invalid"
                 f" ({routes})"]
        seen: set[tuple[str, str]] = set()
        for finding in self.invalid:
            key = (finding.route, finding.message)
            if key in seen:
                continue
            seen.add(key)
            if len(seen) > limit:
                lines.append("  ...")
                break
            lines.append(f"  {finding.route} [{finding.where}]: {finding.message}\n"
                         f"      {finding.body[:300]}")
        return "\n".join(lines)


def _nullable_optionals(node: Any) -> Any:
    """The allowance: optional properties of every object schema may also be null. And
    what the description itself means: OpenAPI 3.0's ``nullable: true``, left in places of
    this 3.1 description where JSON Schema ignores it, allows null."""
    if isinstance(node, dict):
        node = {key: _nullable_optionals(value) for key, value in node.items()}
        if node.pop("nullable", False):
            node = {"anyOf": [node, {"type": "null"}]}
            return node
        props = node.get("properties")
        if isinstance(props, dict):
            required = set(node.get("required", ()))
            node["properties"] = {
                name: (sub if name in required else {"anyOf": [sub, {"type": "null"}]})
                for name, sub in props.items()}
        return node
    if isinstance(node, list):
        return [_nullable_optionals(value) for value in node]
    return node


@cache
def spec() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(gzip.decompress(SNAPSHOT.read_bytes()))
    return loaded


def _resolve(schemas: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schemas[node["$ref"].rsplit("/", 1)[1]]
    return node


def _step(schemas: dict[str, Any], node: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The sub-schema ``key`` ("*": list items) of an object or array schema, looking
    through references and unions."""
    node = _resolve(schemas, node)
    if key == "*" and "items" in node:
        return node["items"]  # type: ignore[no-any-return]
    if key in node.get("properties", {}):
        return node["properties"][key]  # type: ignore[no-any-return]
    for member in (*node.get("anyOf", ()), *node.get("oneOf", ()), *node.get("allOf", ())):
        found = _step(schemas, member, key)
        if found is not None:
            return found
    return None


def _allow_live_values(schemas: dict[str, Any]) -> None:
    for (name, path), extra in LIVE_VALUES.items():
        *parents, last = path.split("/")
        node: dict[str, Any] | None = schemas[name]
        for key in parents:
            node = _step(schemas, node, key) if node is not None else None
        holder = _resolve(schemas, node) if node is not None else None
        target = _step(schemas, holder, last) if holder is not None else None
        if target is None:
            raise KeyError(f"{name}: no {path} in the description")
        original = dict(target)
        target.clear()
        target["anyOf"] = [original, extra]


def relaxed_spec() -> dict[str, Any]:
    """The description with the allowances: what the live API sends is valid."""
    relaxed = copy.deepcopy(spec())
    _allow_live_values(relaxed["components"]["schemas"])
    relaxed["components"] = _nullable_optionals(relaxed["components"])
    return relaxed


@cache
def _registry() -> Registry:
    return Registry().with_resource(BASE, Resource.opaque(relaxed_spec()))


@cache
def validator(schema_name: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"{BASE}#/components/schemas/{schema_name}"},
                                registry=_registry())


@cache
def _route_patterns() -> list[tuple[re.Pattern[str], str]]:
    patterns = []
    for path in spec()["paths"]:
        regex = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path))
        patterns.append((re.compile(f"^/v1{regex}$"), path))
    # literal segments before templates: /responses/input_tokens is not /responses/{id}
    patterns.sort(key=lambda item: item[1].count("{"))
    return patterns


def route_of(path: str) -> str | None:
    for pattern, route in _route_patterns():
        if pattern.match(path):
            return route
    return None


def _schema_name(ref: dict[str, Any] | None) -> str | None:
    if not ref or "$ref" not in ref:
        return None
    return str(ref["$ref"]).rsplit("/", 1)[1]


def response_schema(route: str, method: str, status: int, content_type: str) -> str | None:
    """The schema the description gives a response, or None where it gives none."""
    if status >= 400:
        return "ErrorResponse"
    operation = spec()["paths"][route].get(method.lower())
    if operation is None:
        return None
    response = operation.get("responses", {}).get(str(status)) \
        or operation.get("responses", {}).get("200", {})
    kind = "text/event-stream" if content_type.startswith("text/event-stream") \
        else "application/json"
    return _schema_name(response.get("content", {}).get(kind, {}).get("schema"))


def _branch(schema_name: str, body: Any) -> str:
    """For a union of typed objects (stream events, items), the member the body's
    ``type`` names: its errors say what is wrong rather than 'matches none of 60'."""
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        return schema_name
    node = spec()["components"]["schemas"][schema_name]
    members = node.get("anyOf") or node.get("oneOf") or \
        next((part.get("anyOf") or part.get("oneOf") for part in node.get("allOf", ())
              if part.get("anyOf") or part.get("oneOf")), [])
    for member in members:
        name = _schema_name(member)
        if name is None:
            continue
        target = spec()["components"]["schemas"][name]
        kind = target.get("properties", {}).get("type", {})
        if body["type"] in kind.get("enum", ()) or body["type"] == kind.get("const"):
            return name
    return schema_name


def validate(schema_name: str, body: Any) -> str | None:
    """None if ``body`` is valid, else the most telling error."""
    name = _branch(schema_name, body)
    check = validator(name)
    if check.is_valid(body):
        return None
    error = best_match(check.iter_errors(body))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "(body)"
    return f"{name} at {where}: {error.message[:300]}"


def sse_events(body: str) -> list[str]:
    events = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].lstrip(" ") if line.startswith("data:") else None
                for line in block.split("\n")]
        payload = "\n".join(d for d in data if d is not None)
        if payload and payload != "[DONE]":
            events.append(payload)
    return events


def check_record(record: dict[str, Any], report: Report) -> None:
    route = route_of(record["path"])
    if route is None or route in UNCHECKED or record.get("truncated"):
        return
    if record.get("method") == "OPTIONS":  # a CORS preflight: headers, not an API body
        return
    if record.get("received"):  # a client's WebSocket frame, not the server's answer
        return
    if record["kind"] == "websocket":
        bodies, schema = [record["body"]], "ResponsesWebSocketStreamEvent"
        where = "websocket"
    else:
        schema = response_schema(route, record["method"], record["status"],
                                 record.get("content_type", ""))
        if schema is None:
            return
        stream = record.get("content_type", "").startswith("text/event-stream")
        bodies = sse_events(record["body"]) if stream and record["status"] < 400 \
            else [record["body"]]
        where = f"{record['method']} {record['status']}" + (" stream" if stream else "")
    for text in bodies:
        report.checked[route] += 1
        try:
            body = json.loads(text)
        except ValueError:
            report.invalid.append(Finding(route, where, "not JSON", text[:300]))
            continue
        name = schema
        if isinstance(body, dict) and isinstance(body.get("error"), dict) \
                and "type" not in body and "object" not in body:
            name = "ErrorResponse"  # an error sent inside a stream
        elif record["kind"] == "websocket" and isinstance(body, dict) \
                and body.get("type") == "error":
            name = "ResponseWsError"
        message = validate(name, body)
        if message is not None:
            report.invalid.append(Finding(route, where, message, text))


def check_directory(directory: Path) -> Report:
    """Every captured body: OpenAI's routes against the description, Anthropic's and
    Ollama's against their libraries' types (``sdk_type_check``)."""
    import sdk_type_check
    report = Report()
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").split("\n"):  # not splitlines:
            # JSON text keeps U+2028 and friends raw
            if line.strip():
                record = json.loads(line)
                check_record(record, report)
                sdk_type_check.check_record(record, report)
    return report
