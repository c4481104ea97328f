"""The Batch API under generated worst values: batch lines whose bodies are the fuzz's
request bodies for the four batch endpoints, raw hostile lines, and hostile batch-creation
bodies, ids and list parameters. Nothing gets a 5xx (a route's or a line's), every batch
ends, and the server stays healthy. Its own server: the interactive fuzz's config has no
batch_dir (tests/test_fuzz.py covers the routes themselves)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ServerProcess, start_server, tiny_qwen_config
from fuzz_bodies import JSON, TEXT, hostile_bodies, request_bodies

pytestmark = pytest.mark.model

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
FILES = 30
VALID: dict[str, Any] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/embeddings": {"input": "hi"},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2}}
ROUTE_EXAMPLES = 150


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fuzz-batch")
    cfg = tiny_qwen_config(n_seq_max=4, embedding=True)
    cfg["server"] = {**cfg.get("server", {}), "batch_dir": str(tmp / "batches"),
                     "batch_max_lines": 64, "request_timeout": 10}
    s = start_server(cfg, tmp)
    yield s
    s.stop()


def _short(body: Any) -> Any:
    """Keep answers short (the interactive fuzz covers long limits): a tiny model still
    writes thousands of tokens when asked."""
    if isinstance(body, dict):
        body.pop("stream", None)
        for k in LIMITS:
            if isinstance(body.get(k), int) and not isinstance(body.get(k), bool) \
                    and body[k] > 8:
                body[k] = 8
        if not any(k in body for k in LIMITS):
            body["max_tokens"] = 4
    return body


@st.composite
def batch_files(draw: st.DrawFn) -> tuple[str, bytes]:
    endpoint = draw(st.sampled_from(ENDPOINTS))
    mixed = draw(st.integers(0, 2)) == 0  # else every line passes validation
    lines = [json.dumps({"custom_id": "valid", "method": "POST", "url": endpoint,
                         "body": VALID[endpoint]}).encode()]
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["body", "body", "raw", "line"])) if mixed else "body"
        if kind == "body":
            _, body = draw(request_bodies(paths=(endpoint,)))
            if not mixed and not isinstance(body, dict):
                body = {"input": body}
            item: Any = {"custom_id": f"c{i}", "method": "POST", "url": endpoint,
                         "body": _short(body)}
            lines.append(json.dumps(item).encode())
        elif kind == "raw":
            _, raw = draw(hostile_bodies(paths=(endpoint,)))
            lines.append(raw.replace(b"\n", b" ").replace(b"\r", b" "))
        else:  # a line object with worst values in its own fields
            lines.append(json.dumps({
                "custom_id": draw(st.one_of(TEXT, JSON)), "method": draw(
                    st.sampled_from(["POST", "GET", "post"]) | JSON),
                "url": draw(st.sampled_from([*ENDPOINTS, "/v1/files", ""]) | JSON),
                "body": draw(JSON)}).encode())
    return endpoint, b"\n".join(lines) + b"\n"


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["type"]


def test_generated_batch_files_never_give_a_5xx(server: ServerProcess) -> None:
    http = httpx.Client(base_url=server.base_url, timeout=60)
    batches: list[str] = []

    @settings(max_examples=FILES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(batch_files())
    def check(case: tuple[str, bytes]) -> None:
        endpoint, content = case
        f = http.post("/files", files={"file": ("in.jsonl", content)},
                      data={"purpose": "batch"})
        _check(f)
        if f.status_code != 200:
            return
        b = http.post("/batches", json={"input_file_id": f.json()["id"], "endpoint": endpoint,
                                        "completion_window": "24h"})
        _check(b)
        batches.append(b.json()["id"])

    check()
    assert batches
    deadline = time.monotonic() + 90
    ended: dict[str, Any] = {}
    while len(ended) < len(batches):
        assert time.monotonic() < deadline, "a batch never ended"
        for bid in batches:
            if bid not in ended:
                b = http.get(f"/batches/{bid}").json()
                if b["status"] in ("completed", "failed"):
                    ended[bid] = b
        time.sleep(0.2)
    statuses: dict[int, int] = {}
    for b in ended.values():
        for key in ("output_file_id", "error_file_id"):
            if b[key]:
                for line in http.get(f"/files/{b[key]}/content").text.splitlines():
                    status = json.loads(line)["response"]["status_code"]
                    statuses[status] = statuses.get(status, 0) + 1
                    assert status < 500, line
    assert any(b["status"] == "failed" for b in ended.values())
    print(f"{len(ended)} batches, {sum(b['status'] == 'failed' for b in ended.values())} "
          f"failed validation; line statuses {statuses}")
    assert statuses.get(200) and sum(v for k, v in statuses.items() if k >= 400)
    assert http.get(f"{server.url}/healthz").status_code == 200


ROUTE_CASES = st.one_of(
    st.tuples(st.just("POST"), st.just("/batches"), JSON),
    st.tuples(st.just("POST"), st.just("/batches"), st.fixed_dictionaries({
        "input_file_id": st.one_of(TEXT, JSON), "endpoint": st.sampled_from(ENDPOINTS) | JSON,
        "completion_window": st.sampled_from(["24h", "1h", ""]) | JSON,
        "metadata": JSON})),
    st.tuples(st.sampled_from(["GET", "DELETE"]), TEXT.map(lambda t: f"/files/{t}"),
              st.none()),
    st.tuples(st.sampled_from(["GET", "POST"]), TEXT.map(lambda t: f"/batches/{t}/cancel"),
              st.none()),
    st.tuples(st.just("GET"), st.builds(lambda a, b: f"/batches?limit={a}&after={b}",
                                        st.one_of(TEXT, st.integers()), TEXT), st.none()),
    st.tuples(st.just("GET"), st.builds(lambda a, b: f"/files?limit={a}&order={b}",
                                        st.one_of(TEXT, st.integers()), TEXT), st.none()),
)


def test_batch_routes_worst_values_never_get_a_5xx(server: ServerProcess) -> None:
    http = httpx.Client(base_url=server.base_url, timeout=60)

    @settings(max_examples=ROUTE_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(ROUTE_CASES)
    def check(case: tuple[str, str, Any]) -> None:
        method, path, body = case
        try:
            r = http.request(method, path, json=body) if body is not None else \
                http.request(method, path)
        except httpx.InvalidURL:
            return  # not a URL the client sends
        _check(r)

    check()
    # multipart edge cases: no file, a text field as the file, two files, not multipart
    for kwargs in ({"data": {"purpose": "batch"}},
                   {"data": {"purpose": "batch", "file": "text"}},
                   {"files": [("file", ("a", b"{}\n")), ("file", ("b", b"{}\n"))],
                    "data": {"purpose": "batch"}},
                   {"content": b"{}", "headers": {"content-type": "application/json"}},
                   {"content": b"--x\r\n", "headers": {
                       "content-type": "multipart/form-data; boundary=x"}}):
        _check(http.post("/files", **kwargs))  # type: ignore[arg-type]
    assert http.get(f"{server.url}/healthz").status_code == 200
