"""The session key: what a load balancer hashes so a conversation's turns reach the
replica that holds its KV in memory.

A request's key is the first of:

1. the ``x-session-id`` header (a load balancer may set it: see docs/DEPLOY.md);
2. the ``session_id`` header (the Codex CLI sends one per conversation);
3. the body's ``user`` field (OpenAI), or ``metadata.user_id`` (Anthropic);
4. the key carried in ``previous_response_id``.

llamaserve echoes the key in an ``x-session-id`` response header, and a Responses API id
carries it (``resp_<random>.<key>``) when it is a safe token (``[A-Za-z0-9_-]``, at most
64 characters), so a later turn that only names ``previous_response_id`` hashes to the
same replica (nginx can read the id out of the body: docs/DEPLOY.md). The key only
routes: nothing is shared or trusted because of it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import MutableMapping
from typing import Any

HEADER = "x-session-id"
_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_IN_ID = re.compile(r"resp_[0-9a-f]+\.([A-Za-z0-9_-]{1,64})")
_MAX_KEY = 256  # longer header values or user fields are not keys


def _header(scope: MutableMapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            text = value.decode("latin-1").strip()
            return text if 0 < len(text) <= _MAX_KEY and text.isprintable() else None
    return None


def key_in_response_id(response_id: Any) -> str | None:
    if not isinstance(response_id, str):
        return None
    match = _IN_ID.fullmatch(response_id)
    return match.group(1) if match else None


def session_key(scope: MutableMapping[str, Any], body: dict[str, Any] | None) -> str | None:
    key = _header(scope, b"x-session-id") or _header(scope, b"session_id")
    if key is None and body is not None:
        user = body.get("user")
        metadata = body.get("metadata")
        if not isinstance(user, str) and isinstance(metadata, dict):
            user = metadata.get("user_id")
        if isinstance(user, str) and 0 < len(user) <= _MAX_KEY and user.isprintable():
            key = user
        else:
            key = key_in_response_id(body.get("previous_response_id"))
    return key


def note_session(scope: MutableMapping[str, Any], body: dict[str, Any] | None) -> None:
    """Record the request's key for the ``x-session-id`` response header (``api.web.gate``)."""
    key = session_key(scope, body)
    if key is not None and isinstance(scope.get("llamaserve"), dict):
        scope["llamaserve"]["session"] = key


def noted_session(scope: MutableMapping[str, Any]) -> str | None:
    notes = scope.get("llamaserve")
    return notes.get("session") if isinstance(notes, dict) else None


def response_id(key: str | None) -> str:
    """A new Responses API id, carrying ``key`` when it is a safe token."""
    rid = f"resp_{secrets.token_hex(12)}"
    return f"{rid}.{key}" if key is not None and _SAFE.fullmatch(key) else rid
