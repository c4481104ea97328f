"""Hypothesis strategies for request bodies: near-valid requests with fields of the wrong
type, out of range, unknown, or missing, for every endpoint. Shared by the short CI fuzz
(tests/test_fuzz.py) and the long one (bench/fuzz.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)

TEXT = st.text(max_size=40)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant",
                                                          "tool", "developer", "robot"]),
                                 "content": TEXT | st.lists(st.fixed_dictionaries({
                                     "type": st.sampled_from(["text", "image_url", "x"]),
                                     "text": TEXT}), max_size=2) | JSON})
TOOL = st.fixed_dictionaries({"type": st.sampled_from(["function", "web_search"]),
                              "function": st.fixed_dictionaries({
                                  "name": st.sampled_from(["f", "get_weather", ""]),
                                  "parameters": st.just({"type": "object", "properties": {
                                      "a": {"type": "integer"}}}) | JSON})})
COMMON: dict[str, Any] = {
    "model": st.sampled_from(["x", "gemma-3-270m"]) | JSON,
    "max_tokens": st.integers(-5, 6) | JSON,
    "temperature": st.floats(-1, 3, allow_nan=False) | JSON,
    "top_p": st.floats(-1, 2, allow_nan=False) | JSON,
    "top_k": st.integers(-3, 100) | JSON,
    "n": st.integers(-1, 20) | JSON,
    "seed": st.integers(-2**70, 2**70) | JSON,
    "stop": TEXT | st.lists(TEXT, max_size=20) | JSON,
    "logit_bias": st.dictionaries(st.sampled_from(["1", "262144", "-1", "x"]),
                                  st.integers(-200, 200), max_size=3) | JSON,
    "stream": st.booleans() | JSON,
    "logprobs": st.integers(-1, 25) | st.booleans() | JSON,
    "unknown_field": JSON,
}
ENDPOINTS: dict[str, dict[str, Any]] = {
    "/v1/completions": {**COMMON, "prompt": TEXT | st.lists(TEXT, max_size=3)
                        | st.lists(st.integers(-10, 300000), max_size=5) | JSON,
                        "echo": st.booleans() | JSON, "suffix": TEXT},
    "/v1/chat/completions": {**COMMON, "messages": st.lists(MESSAGE, max_size=3) | JSON,
                             "tools": st.lists(TOOL, max_size=2) | JSON,
                             "tool_choice": st.sampled_from(["auto", "none", "required"])
                             | st.just({"type": "function", "function": {"name": "f"}})
                             | JSON,
                             "response_format": st.sampled_from([
                                 {"type": "json_object"}, {"type": "text"},
                                 {"type": "json_schema", "json_schema": {
                                     "name": "s", "schema": {"type": "object"}}}]) | JSON,
                             "top_logprobs": st.integers(-1, 30) | JSON},
    "/v1/responses": {**COMMON, "input": TEXT | st.lists(st.fixed_dictionaries({
        "type": st.sampled_from(["message", "function_call_output", "reasoning", "x"]),
        "role": st.sampled_from(["user", "assistant", "x"]), "content": TEXT | JSON}),
        max_size=3) | JSON, "instructions": TEXT | JSON,
        "max_output_tokens": st.integers(-2, 6) | JSON, "previous_response_id": TEXT,
        "text": st.just({"format": {"type": "json_object"}}) | JSON},
    "/v1/embeddings": {"model": JSON, "input": TEXT | st.lists(TEXT, max_size=4) | JSON,
                       "encoding_format": st.sampled_from(["float", "base64", "int8"]) | JSON,
                       "dimensions": st.integers(-2, 2000) | JSON},
    "/v1/tokenize": {"prompt": TEXT | JSON, "messages": st.lists(MESSAGE, max_size=2) | JSON,
                     "add_special": st.booleans() | JSON, "with_pieces": st.booleans() | JSON},
    "/v1/detokenize": {"tokens": st.lists(st.integers(-5, 300000), max_size=8) | JSON},
}


@st.composite
def request_bodies(draw: st.DrawFn) -> tuple[str, Any]:
    """(path, body): usually an object with a random subset of the endpoint's fields,
    sometimes not an object at all."""
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    if draw(st.integers(0, 19)) == 0:
        return path, draw(JSON)
    fields = ENDPOINTS[path]
    keys = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=len(fields)))
    return path, {k: draw(fields[k]) for k in keys}


def post(http: httpx.Client, case: tuple[str, Any]) -> httpx.Response:
    """Send one generated (path, body) as raw JSON (bodies need not be objects)."""
    path, body = case
    return http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
