"""Code infill on the real Qwen2.5-Coder-0.5B (it has FIM tokens) through /v1/completions
``suffix`` and llama-server's /infill; Gemma 3 (no FIM tokens) refuses both."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import OpenAI

from conftest import ServerProcess

PREFIX = "def add(a: int, b: int) -> int:\n    \"\"\"Return the sum of a and b.\"\"\"\n    total ="
SUFFIX = "\n    return total\n"


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def test_completions_suffix_fills_the_middle(qwen_server: ServerProcess) -> None:
    client = OpenAI(base_url=qwen_server.base_url, api_key="unused", max_retries=0)
    r = client.completions.create(model="x", prompt=PREFIX, suffix=SUFFIX, max_tokens=12,
                                  temperature=0)
    middle = r.choices[0].text
    # the gap's expression comes first (the 0.5B model may then go on past the gap)
    assert middle.replace("a+b", "a + b").strip().startswith("a + b"), middle


def test_infill_in_fim_order_streamed_and_not(qwen_server: ServerProcess) -> None:
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12,
            "temperature": 0, "input_extra": [
                {"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]}
    r = post(qwen_server, "/infill", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert "a + b" in out["content"].replace("a+b", "a + b"), out["content"]
    assert out["stop"] is True and out["tokens_predicted"] > 0
    # the model's own FIM tokens, repository-level order: extra files, then P, S, M
    p = out["prompt"]
    marks = [p.index(m) for m in ("<|repo_name|>", "<|file_sep|>util.py", "<|fim_prefix|>",
                                  "<|fim_suffix|>", "<|fim_middle|>")]
    assert marks == sorted(marks) and p.endswith("<|fim_middle|>")
    pieces = []
    final: dict[str, Any] = {}
    with httpx.stream("POST", f"{qwen_server.url}/infill", json={**body, "stream": True},
                      timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["stop"]:
                    final = event
                else:
                    pieces.append(event["content"])
    assert ("".join(pieces) == out["content"] and final["tokens_predicted"] == len(pieces)) or \
        "".join(pieces) == out["content"]


def test_a_longer_prefix_reuses_the_cache(qwen_server: ServerProcess) -> None:
    """Keystrokes: each request's prefix extends the last one's."""
    code = "import math\n\n" + "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(30))
    first = post(qwen_server, "/infill", {"input_prefix": code, "input_suffix": "\n",
                                           "n_predict": 2, "temperature": 0}).json()
    second = post(qwen_server, "/infill", {"input_prefix": code + "def g(", "input_suffix":
                                           "\n", "n_predict": 2, "temperature": 0}).json()
    assert first["tokens_evaluated"] > 300
    assert second["tokens_cached"] >= first["tokens_evaluated"] - 8  # all but the tail


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/infill", {"input_prefix": 5}, "input_prefix"),
    ("/infill", {"input_prefix": "x", "input_extra": [1]}, "input_extra[0]"),
    ("/infill", {"input_prefix": "x", "input_extra": {"a": 1}}, "input_extra"),
    ("/v1/completions", {"prompt": [1, 2], "suffix": "x"}, "suffix"),
    ("/v1/completions", {"prompt": "x", "suffix": "y", "echo": True}, "suffix"),
])
def test_bad_infill_requests_are_400(qwen_server: ServerProcess, path: str,
                                     body: dict[str, Any], param: str) -> None:
    r = post(qwen_server, path, {"model": "x", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_model_without_fim_tokens_refuses_infill(gemma_server: ServerProcess) -> None:
    for path, body, param in (("/infill", {"input_prefix": "a", "input_suffix": "b"},
                               "input_prefix"),
                              ("/v1/completions", {"prompt": "a", "suffix": "b"}, "suffix")):
        r = post(gemma_server, path, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "fill-in-the-middle" in r.json()["error"]["message"]
