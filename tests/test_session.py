"""The session key a load balancer hashes (api.web.session): where it comes from, which wins,
and which keys travel inside response ids."""

from __future__ import annotations

from typing import Any

from api.web.session import key_in_response_id, response_id, session_key


def scope(**headers: str) -> dict[str, Any]:
    return {"headers": [(k.replace("_", "-").encode() if k != "session_id" else b"session_id",
                         v.encode("latin-1")) for k, v in headers.items()]}


def test_precedence_header_then_codex_header_then_user_then_previous_id() -> None:
    body = {"user": "u1", "previous_response_id": "resp_ab12.k9"}
    assert session_key(scope(x_session_id="h1", session_id="c1"), body) == "h1"
    assert session_key(scope(session_id="c1"), body) == "c1"
    assert session_key(scope(), body) == "u1"
    assert session_key(scope(), {"previous_response_id": "resp_ab12.k9"}) == "k9"
    assert session_key(scope(), {"metadata": {"user_id": "anthropic-user"}}) == "anthropic-user"
    assert session_key(scope(), {"input": "hi"}) is None


def test_unusable_values_are_no_key() -> None:
    for bad in ("", "a" * 300, "tab\there" + "\x85"):
        assert session_key(scope(x_session_id=bad), None) is None
    for user in ("", "x" * 257, "\ud800", "line\nbreak", 7, None, ["a"]):
        assert session_key(scope(), {"user": user}) is None


def test_safe_keys_travel_in_response_ids_and_come_back() -> None:
    rid = response_id("conversation-42_a")
    assert rid.startswith("resp_") and key_in_response_id(rid) == "conversation-42_a"
    for unsafe in ("alice@example.com", "a b", "k" * 65, None):
        rid = response_id(unsafe)
        assert "." not in rid and key_in_response_id(rid) is None
    assert key_in_response_id("resp_zz.k") is None  # not an id llamaserve made
    assert key_in_response_id(12) is None
