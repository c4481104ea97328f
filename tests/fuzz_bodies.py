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
# a chat template for the fuzz server (Gemma 3 270M has none), so chat, Responses and
# Anthropic bodies run all the way through rendering, grammars and generation
CHATML = ("{% for m in messages %}<start>{{ m.role }}\n{{ m.content or '' }}"
          "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}<end>\n{% endfor %}"
          "{% if tools %}{{ tools | tojson }}{% endif %}<start>assistant\n")
BLOCK = st.fixed_dictionaries({
    "type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "x"]),
    "text": TEXT | JSON, "id": TEXT, "tool_use_id": TEXT, "name": TEXT,
    "input": JSON, "content": TEXT | JSON, "thinking": TEXT})
ANTHROPIC: dict[str, Any] = {
    "model": COMMON["model"], "system": TEXT | st.lists(BLOCK, max_size=2) | JSON,
    "messages": st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "assistant", "x"]),
        "content": TEXT | st.lists(BLOCK, max_size=3) | JSON}), max_size=3) | JSON,
    "tools": st.lists(st.fixed_dictionaries({"name": TEXT, "input_schema": JSON}),
                      max_size=2) | JSON,
    "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(
        ["auto", "any", "tool", "none", "x"]), "name": TEXT}) | JSON,
    "thinking": JSON, "output_config": JSON, "unknown_field": JSON}
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
        "type": st.sampled_from(["message", "function_call_output", "reasoning", "x",
                                 "custom_tool_call", "local_shell_call", "web_search_call",
                                 "function_call", "item_reference"]),
        "role": st.sampled_from(["user", "assistant", "x"]), "content": TEXT | JSON,
        "output": TEXT | JSON, "name": TEXT, "namespace": TEXT | JSON,
        "encrypted_content": TEXT | JSON, "action": JSON}),
        max_size=3) | JSON, "instructions": TEXT | JSON,
        "tools": st.lists(st.fixed_dictionaries({
            "type": st.sampled_from(["function", "custom", "namespace", "local_shell",
                                     "web_search", "mcp", "x"]),
            "name": TEXT, "tools": JSON, "format": JSON, "parameters": JSON}), max_size=3)
        | JSON,
        "include": st.just(["reasoning.encrypted_content"]) | JSON,
        "max_output_tokens": st.integers(-2, 6) | JSON, "previous_response_id": TEXT,
        "text": st.just({"format": {"type": "json_object"}}) | JSON},
    "/v1/embeddings": {"model": JSON, "input": TEXT | st.lists(TEXT, max_size=4) | JSON,
                       "encoding_format": st.sampled_from(["float", "base64", "int8"]) | JSON,
                       "dimensions": st.integers(-2, 2000) | JSON},
    "/v1/tokenize": {"prompt": TEXT | JSON, "messages": st.lists(MESSAGE, max_size=2) | JSON,
                     "add_special": st.booleans() | JSON, "with_pieces": st.booleans() | JSON},
    "/v1/detokenize": {"tokens": st.lists(st.integers(-5, 300000), max_size=8) | JSON},
    "/v1/messages": {**ANTHROPIC, "max_tokens": st.integers(-2, 6) | JSON,
                     "stream": st.booleans() | JSON,
                     "stop_sequences": st.lists(TEXT, max_size=3) | JSON},
    "/v1/messages/count_tokens": ANTHROPIC,
    "/infill": {"input_prefix": TEXT | JSON, "input_suffix": TEXT | JSON, "prompt": TEXT,
                "input_extra": st.lists(st.fixed_dictionaries({"filename": TEXT | JSON,
                                                               "text": TEXT | JSON}),
                                        max_size=2) | JSON,
                "n_predict": st.integers(-2, 6) | JSON, "stream": st.booleans() | JSON,
                "temperature": COMMON["temperature"]},
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


# -- hostile bodies: raw JSON text no json.dumps of a Python value would give ---------------

NUMBER_FIELDS = ["temperature", "top_p", "top_k", "n", "seed", "max_tokens", "logprobs",
                 "top_logprobs", "presence_penalty", "frequency_penalty", "repeat_penalty",
                 "min_p", "dimensions", "max_output_tokens", "max_completion_tokens"]
TEXT_FIELDS = ["prompt", "input", "instructions", "model", "stop", "suffix",
               "previous_response_id"]
# boundaries of every numeric field's type: the edges the validators check, machine-word
# edges, float edges and values just past them
BOUNDARY_NUMBERS = ["0", "-0", "1", "-1", "2", "0.5", "-0.0", "1e-400", "2.0000000001",
                    "1.7976931348623157e308", "5e-324", "4294967295", "4294967296",
                    "2147483647", "-2147483648", "9223372036854775807", "-9223372036854775808",
                    "18446744073709551615", "18446744073709551616", "1e308", "262143", "262144",
                    "100", "101", "-100", "-101", "20", "21", "true", "false", "null", "\"1\"",
                    "[]", "{}"]
HUGE_NUMBERS = st.one_of(
    st.integers(300, 6000).map(lambda k: "1" + "0" * k),
    st.integers(300, 6000).map(lambda k: "-0." + "1" * k),
    st.sampled_from(["1e400", "-1e400", "1e99999", "NaN", "Infinity", "-Infinity", "1E+309",
                     "123456789012345678901234567890e-5"]))
# any code point, surrogates included (json.dumps escapes them as \udXXX)
WILD_TEXT = st.text(st.characters(blacklist_categories=()), max_size=30) | st.sampled_from([
    "\ud83d", "\udc00x", "a\x00b", "\U0010ffff", "\ufffe\uffff", "\u2028\u2029", "\U0001f600",
    "\ud83d\ude00"])


def _nest(depth: int, open_: str, close: str, inner: str = "1") -> str:
    return open_ * depth + inner + close * depth


DEEP = st.builds(lambda d, kind, balanced: (
    _nest(d, "[", "]") if kind == 0 else
    _nest(d, '{"a":', "}") if kind == 1 else
    _nest(d, '[{"x":', "}]"))[: None if balanced else d],
    st.sampled_from([30, 63, 64, 65, 200, 999, 1000, 1001, 5000, 20000]),
    st.integers(0, 2), st.booleans())


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """(path, raw body): a near-valid body with one hostile part, or a hostile whole."""
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    base = {"prompt": "Hi", "input": "Hi", "messages": [{"role": "user", "content": "Hi"}],
            "tokens": [1, 2], "max_tokens": 2, "max_output_tokens": 2}
    parts = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in base.items()]
    kind = draw(st.sampled_from(["deep", "deep_whole", "text", "key", "number", "boundary",
                                 "duplicate", "bad_utf8", "long", "arguments"]))
    if kind == "deep":
        parts.append(f'{json.dumps(draw(st.sampled_from([*sorted(base), "tools"])))}: '
                     f"{draw(DEEP)}")
        parts = parts[1:] if parts[-1].startswith('"prompt"') else parts
    elif kind == "deep_whole":
        return path, draw(DEEP).encode()
    elif kind == "text":
        field = draw(st.sampled_from([*TEXT_FIELDS, "messages"]))
        text = draw(WILD_TEXT)
        value = [{"role": "user", "content": text}] if field == "messages" else text
        parts = [p for p in parts if not p.startswith(json.dumps(field))]
        parts.append(f"{json.dumps(field)}: {json.dumps(value)}")
    elif kind == "arguments":  # JSON inside a string: a tool call's arguments
        inner = draw(DEEP | WILD_TEXT.map(lambda t: json.dumps({"a": t}))
                     | HUGE_NUMBERS.map(lambda n: '{"a": ' + n + "}"))
        messages = [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": None, "tool_calls": [{
                        "id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": inner}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        parts = [p for p in parts if not p.startswith('"messages"')]
        parts.append(f'"messages": {json.dumps(messages)}')
        parts.append('"input": ' + json.dumps([{"type": "function_call", "call_id": "c1",
                                                "name": "f", "arguments": inner}]))
        parts = [p for p in parts if not p.startswith('"input": "')]
    elif kind == "key":
        parts.append(f"{json.dumps(draw(WILD_TEXT))}: 1")
    elif kind in ("number", "boundary"):
        field = draw(st.sampled_from(NUMBER_FIELDS))
        value = draw(HUGE_NUMBERS if kind == "number" else st.sampled_from(BOUNDARY_NUMBERS))
        parts = [p for p in parts if not p.startswith(json.dumps(field))]
        parts.append(f"{json.dumps(field)}: {value}")
    elif kind == "duplicate":
        parts.append(draw(st.sampled_from(parts)))
    elif kind == "long":
        field = draw(st.sampled_from(["prompt", "input", "stop", "tokens"]))
        n = draw(st.sampled_from([10_000, 300_000]))
        value = json.dumps(list(range(n)) if field == "tokens" else "ab" * n)
        parts = [p for p in parts if not p.startswith(json.dumps(field))]
        parts.append(f"{json.dumps(field)}: {value}")
    raw = ("{" + ", ".join(draw(st.permutations(parts))) + "}").encode()
    if kind == "bad_utf8":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xed\xa0\xbd", b"\xc3", b"\x00",
                                               b"\xf4\x90\x80\x80"])) + raw[at:]
    return path, raw


def any_bodies() -> st.SearchStrategy[tuple[str, bytes]]:
    """Near-valid bodies (as raw JSON) and hostile ones, about half each."""
    return request_bodies().map(lambda c: (c[0], json.dumps(c[1]).encode())) | hostile_bodies()


def post_raw(http: httpx.Client, case: tuple[str, bytes]) -> httpx.Response | None:
    """Send one raw body; None when the connection was dropped without a response."""
    path, raw = case
    try:
        return http.post(path, content=raw, headers={"content-type": "application/json"})
    except httpx.TransportError:
        return None


def check_error_shape(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        body = r.json()
        if r.request.url.path.startswith("/v1/messages"):  # Anthropic's shape there
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, \
                r.text[:300]
            return
        assert set(body["error"]) == {"message", "type", "param", "code"}, r.text[:300]


# -- WebSocket frames ------------------------------------------------------------------------

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@st.composite
def ws_frames(draw: st.DrawFn) -> tuple[str, str | bytes]:
    """(kind, frame): a response.create that may be hostile, sent as text or binary,
    an oversize frame, or a pair of interleaved creates (kind ``interleaved``)."""
    kind = draw(st.sampled_from(["valid", "fuzzed", "hostile", "binary", "binary_junk",
                                 "oversize", "interleaved"]))
    create = {"type": "response.create", "model": "x", "input": "Say hi.",
              "max_output_tokens": 2}
    if kind in ("valid", "interleaved"):
        return kind, json.dumps(create)
    if kind == "fuzzed":
        _, body = draw(request_bodies())
        if isinstance(body, dict):
            body = {"type": "response.create", **body}
        return kind, json.dumps(body)
    if kind == "hostile":
        _, raw = draw(hostile_bodies())
        text = raw.decode("utf-8", "replace")
        if text.startswith("{") and draw(st.booleans()):
            text = '{"type": "response.create", ' + text[1:]
        return kind, text
    if kind == "binary":
        return kind, json.dumps(create).encode()
    if kind == "binary_junk":
        return kind, draw(st.binary(max_size=64))
    return kind, json.dumps({**create, "input": "x" * 70_000})  # past max_body_bytes 64 KiB


def ws_exchange(ws: Any, kind: str, frame: str | bytes, timeout: float = 60) -> list[str]:
    """Send a frame (two creates for ``interleaved``) and read until every reply came:
    an ``error`` event or a terminal response event per create. Returns what was seen
    ("error:<code>:<status>" or the terminal type)."""
    frames = [frame, frame] if kind == "interleaved" else [frame]
    for f in frames:
        ws.send(f)
    seen: list[str] = []
    answered = 0
    while answered < len(frames):
        event = json.loads(ws.recv(timeout=timeout))
        if event["type"] == "error":
            seen.append(f"error:{event['error']['code']}:{event['status']}")
            answered += 1
        elif event["type"] in TERMINAL:
            seen.append(event["type"])
            answered += 1
    return seen
