"""Template errors are client errors (400 with the template's message), not 500s."""

from __future__ import annotations

import httpx

from conftest import ServerProcess


def test_template_raise_exception_is_a_400(gemma_server: ServerProcess) -> None:
    r = httpx.post(f"{gemma_server.base_url}/chat/completions", json={"messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "template_error"
    assert "Conversation roles must alternate" in err["message"]


def test_config_template_is_used(gemma_server: ServerProcess) -> None:
    r = httpx.post(f"{gemma_server.base_url}/tokenize", json={
        "messages": [{"role": "user", "content": "Hi"}], "with_pieces": True}, timeout=30).json()
    text = "".join(r["pieces"])
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
