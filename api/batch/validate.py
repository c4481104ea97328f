"""A batch's input file checked line by line before it runs (OpenAI's ``validating``):
each line one JSON object ``{"custom_id", "method": "POST", "url": <the batch's
endpoint>, "body": {...}}`` with a unique ``custom_id``. What its body says is checked
later, by the endpoint's own handler, line by line (a per-line error)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from api.batch.store import Line

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_ERRORS = 100  # errors reported for one file (OpenAI's ``errors.data``)


@dataclass
class Checked:
    lines: list[Line] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


def _error(line: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "line": line, "message": message, "param": param}


def check_line(raw: bytes, number: int, endpoint: str, seen: set[str]
               ) -> tuple[str | None, dict[str, Any] | None]:
    """(custom_id, None) for a good line, (None, error) otherwise."""
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError):
        return None, _error(number, "invalid_json_line",
                            f"Line {number} is not valid JSON.")
    if not isinstance(item, dict):
        return None, _error(number, "invalid_json_line",
                            f"Line {number} is not a JSON object.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return None, _error(number, "missing_required_parameter",
                            f"Line {number}: 'custom_id' must be a non-empty string "
                            "(at most 512 characters).", "custom_id")
    if custom_id in seen:
        return None, _error(number, "duplicate_custom_id",
                            f"Line {number}: the custom_id '{custom_id}' is used more than "
                            "once; each line needs its own.", "custom_id")
    if item.get("method") != "POST":
        return None, _error(number, "invalid_method",
                            f"Line {number}: 'method' must be 'POST'.", "method")
    if item.get("url") != endpoint:
        return None, _error(number, "mismatched_endpoint",
                            f"Line {number}: the url {json.dumps(item.get('url'))[:200]} does "
                            f"not match the batch's endpoint '{endpoint}'.", "url")
    if not isinstance(item.get("body"), dict):
        return None, _error(number, "invalid_request",
                            f"Line {number}: 'body' must be a JSON object.", "body")
    if item["body"].get("stream"):
        return None, _error(number, "invalid_request",
                            f"Line {number}: 'stream' is not supported in a batch.",
                            "body.stream")
    return custom_id, None


def check_file(f: BinaryIO, endpoint: str, max_lines: int) -> Checked:
    out = Checked()
    seen: set[str] = set()
    offset = number = 0
    for raw in f:
        start, offset = offset, offset + len(raw)
        if not raw.strip():
            continue
        number += 1
        if number > max_lines:
            out.errors = [_error(number, "too_many_lines",
                                 f"The file has more than {max_lines} requests "
                                 "(server.batch_max_lines).")]
            return out
        custom_id, error = check_line(raw, number, endpoint, seen)
        if error is not None:
            if len(out.errors) < MAX_ERRORS:
                out.errors.append(error)
            continue
        assert custom_id is not None
        seen.add(custom_id)
        out.lines.append(Line(number - 1, custom_id, start, len(raw)))
    if number == 0:
        out.errors.append(_error(0, "empty_file", "The input file has no requests."))
    return out
