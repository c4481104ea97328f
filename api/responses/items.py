"""Items as the Responses API lists them: a request's input, a conversation's history.

``resource_items`` turns what a client sent as ``input`` (a string, or items in any of the
shapes the API accepts) into the items ``GET /v1/responses/{id}/input_items`` and the
Conversations API return: each with an ``id`` and a ``status``, message content as typed
parts. ``page`` cuts a list the way every list route of the API is paginated
(``order``, ``after``, ``limit``; ``first_id``, ``last_id``, ``has_more``).
"""

from __future__ import annotations

from typing import Any

from api.responses.events import new_item_id
from api.web.errors import APIError, invalid

ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
             "custom_tool_call": "ctc", "custom_tool_call_output": "ctco",
             "local_shell_call": "lsh", "local_shell_call_output": "lsho", "reasoning": "rs"}
MAX_LIMIT = 100


def _content(role: str, content: Any) -> list[Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        part: dict[str, Any] = {"type": kind, "text": content}
        if kind == "output_text":
            part.update(annotations=[], logprobs=[])
        return [part]
    if isinstance(content, list):
        return [({"type": kind, "text": p} if isinstance(p, str) else p) for p in content]
    return []


def resource_item(item: Any) -> dict[str, Any]:
    """One input item with the fields a listed item carries."""
    if not isinstance(item, dict):
        return item  # type: ignore[no-any-return]
    kind = item.get("type", "message")
    kind = kind if isinstance(kind, str) else "message"
    out = {**item, "type": kind}
    if kind == "message":
        role = item.get("role", "user")
        out["content"] = _content(role, item.get("content"))
    if not isinstance(out.get("id"), str) or not out["id"]:
        out["id"] = new_item_id(ID_PREFIX.get(kind, "item"))
    if kind in ID_PREFIX and kind != "reasoning":
        out.setdefault("status", "completed")
    return out


def resource_items(raw: Any) -> list[dict[str, Any]]:
    """A request's ``input`` as listed items."""
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        return []
    return [resource_item(item) for item in raw]


def page(items: list[dict[str, Any]], query: Any, default_order: str = "desc"
         ) -> dict[str, Any]:
    """One page of ``items`` (kept oldest first) as the API lists them."""
    order = query.get("order") or default_order
    if order not in ("asc", "desc"):
        raise invalid("order", "'order' must be 'asc' or 'desc'")
    raw_limit = query.get("limit") or "20"
    try:
        limit = int(raw_limit)
    except ValueError:
        raise invalid("limit", "'limit' must be an integer") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid("limit", f"'limit' must be between 1 and {MAX_LIMIT}")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise APIError(f"No item found with id '{after[:200]}'.", status=404,
                           param="after", code="not_found")
        ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(ordered) > limit}
