"""Check captured Anthropic and Ollama traffic against their client libraries' own types.

The OpenAI routes are checked against OpenAI's OpenAPI description (``openapi_check``).
Anthropic publishes its Messages API as the ``anthropic`` SDK's pydantic types, Ollama its
API as the ``ollama`` library's: each body of ``/v1/messages`` (JSON, every stream event,
errors) and of Ollama's ``/api/…`` routes (JSON, every NDJSON line) must validate as the
type that library parses it into.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

from openapi_check import Finding, Report, sse_events

Check = Callable[[Any], None]


@cache
def _anthropic() -> dict[str, Check]:
    import anthropic.types as t
    from pydantic import TypeAdapter

    events = TypeAdapter(t.RawMessageStreamEvent)

    def event(body: Any) -> None:
        """A stream event; ``ping`` and ``error`` are events of the API's stream that the
        SDK reads apart from the message events' union."""
        if isinstance(body, dict) and body.get("type") == "ping" and len(body) == 1:
            return
        if isinstance(body, dict) and body.get("type") == "error":
            error(body)
            return
        events.validate_python(body)

    def error(body: Any) -> None:
        """Anthropic's error body. Its docs list ``request_too_large`` (413), which the
        SDK's union of error types lacks: checked as the same shape."""
        if isinstance(body, dict) and isinstance(body.get("error"), dict) \
                and body["error"].get("type") == "request_too_large":
            body = {**body, "error": {**body["error"], "type": "invalid_request_error"}}
        t.ErrorResponse.model_validate(body)

    return {"message": t.Message.model_validate, "event": event,
            "count": t.MessageTokensCount.model_validate, "error": error}


@cache
def _ollama() -> dict[str, Check]:
    import ollama

    return {"/api/chat": ollama.ChatResponse.model_validate,
            "/api/generate": ollama.GenerateResponse.model_validate,
            "/api/embed": ollama.EmbedResponse.model_validate,
            "/api/embeddings": ollama.EmbeddingsResponse.model_validate,
            "/api/tags": ollama.ListResponse.model_validate,
            "/api/ps": ollama.ProcessResponse.model_validate,
            "/api/show": ollama.ShowResponse.model_validate,
            "/api/pull": ollama.ProgressResponse.model_validate}


def _ollama_error(body: Any) -> None:
    if not (isinstance(body, dict) and isinstance(body.get("error"), str)):
        raise ValueError("an Ollama error is {\"error\": message}")


def _checks(record: dict[str, Any]) -> tuple[str, list[str], Check] | None:
    path, status = record["path"], record.get("status", 200)
    kind = record.get("content_type", "")
    if path in ("/v1/messages", "/v1/messages/count_tokens"):
        checks = _anthropic()
        if status >= 400:
            return path, [record["body"]], checks["error"]
        if path.endswith("count_tokens"):
            return path, [record["body"]], checks["count"]
        if kind.startswith("text/event-stream"):
            return path, sse_events(record["body"]), checks["event"]
        return path, [record["body"]], checks["message"]
    if path.startswith("/api/"):
        if status >= 400:
            return path, [record["body"]], _ollama_error
        check = _ollama().get(path)
        if check is None:
            return None
        lines = [line for line in record["body"].splitlines() if line.strip()] \
            if "ndjson" in kind else [record["body"]]
        return path, lines, check
    return None


def check_record(record: dict[str, Any], report: Report) -> None:
    if record["kind"] != "http" or record.get("truncated"):
        return
    found = _checks(record)
    if found is None:
        return
    route, bodies, check = found
    where = f"{record['method']} {record['status']}"
    for text in bodies:
        report.checked[route] += 1
        try:
            check(json.loads(text))
        except Exception as exc:  # pydantic's ValidationError, or not JSON
            report.invalid.append(Finding(route, where, str(exc)[:400], text))
