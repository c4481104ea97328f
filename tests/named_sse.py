"""Read a stream of named server-sent events (``event: NAME`` + ``data: JSON``), as the
Responses and Anthropic APIs send them, checking that each name is its data's type."""

from __future__ import annotations

import json
from typing import Any

import httpx


def named_events(url: str, body: dict[str, Any], timeout: float = 120) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url, json=body, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == name  # the event: line names the data's type
                events.append(event)
    return events
