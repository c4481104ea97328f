"""OpenAI's Files and Batch APIs end to end through the OpenAI SDK: a chat batch on the tiny
random-weight Qwen and an embeddings batch on all-MiniLM-L6-v2, each answer equal to the
same request sent interactively; bad input; cancel; kill -9 mid-batch and restart."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from batch_lines import hold_every_sequence, jsonl, lines, wait
from openai import OpenAI
from openai.types import Batch

from conftest import (
    ServerProcess,
    minilm_config,
    same_greedy_text,
    start_server,
    tiny_qwen_config,
)

pytestmark = pytest.mark.model

CHAT_LINES = 200
MAX_LINES = 250


def batch_server(cfg: dict[str, Any], tmp: Path, **server: Any) -> ServerProcess:
    cfg["server"] = {**cfg.get("server", {}), "batch_dir": str(tmp / "batches"), **server}
    return start_server(cfg, tmp)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = batch_server(tiny_qwen_config(n_seq_max=8), tmp_path_factory.mktemp("batch"),
                          batch_file_max_bytes=256 * 1024, batch_max_lines=MAX_LINES)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(tiny: ServerProcess) -> OpenAI:
    return OpenAI(base_url=tiny.base_url, api_key="unused", max_retries=0)


def chat_body(i: int, max_tokens: int = 8) -> dict[str, Any]:
    return {"model": "tiny-qwen", "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]}


def run(client: OpenAI, content: bytes, endpoint: str, timeout: float = 120) -> Batch:
    f = client.files.create(file=("input.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=endpoint,  # type: ignore[arg-type]
                                  completion_window="24h", metadata={"job": "test"})
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    return wait(client, batch.id, timeout)


def same_chat(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["choices"] == b["choices"]
    # the same counts; how many prompt tokens the prefix cache held may differ
    assert {k: v for k, v in a["usage"].items() if k != "prompt_tokens_details"} == \
        {k: v for k, v in b["usage"].items() if k != "prompt_tokens_details"}
    assert a["object"] == b["object"] == "chat.completion"


def test_chat_batch_equals_interactive_answers(client: OpenAI, tiny: ServerProcess) -> None:
    bodies = [chat_body(i) for i in range(CHAT_LINES)]
    bodies[7] = {**bodies[7], "temperature": -1}  # a per-line error, as interactive
    batch = run(client, jsonl("/v1/chat/completions", bodies), "/v1/chat/completions")
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed,
            batch.request_counts.failed) == (CHAT_LINES, CHAT_LINES - 1, 1)
    assert batch.completed_at and batch.in_progress_at and batch.finalizing_at
    assert batch.usage is not None and batch.usage.output_tokens == 8 * (CHAT_LINES - 1)
    out, errors = lines(client, batch.output_file_id), lines(client, batch.error_file_id)
    assert set(out) | set(errors) == {f"req-{i}" for i in range(CHAT_LINES)}
    assert set(errors) == {"req-7"}

    def interactive(i: int) -> httpx.Response:
        return httpx.post(f"{tiny.base_url}/chat/completions", json=bodies[i], timeout=60)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(interactive, range(CHAT_LINES)))
    differ = []
    for i, answer in enumerate(answers):
        line = (errors if i == 7 else out)[f"req-{i}"]
        assert line["error"] is None and line["id"].startswith("batch_req_")
        assert line["response"]["status_code"] == answer.status_code
        if i == 7:
            assert line["response"]["body"] == answer.json()  # the same error body
            continue
        try:
            same_chat(line["response"]["body"], answer.json())
        except AssertionError:
            differ.append(i)
    # Greedy answers of a random-weight model sit on near-ties: a different batch
    # composition (CPU kernels chosen by batch size) can flip a late token. Nearly all
    # must be identical (the same code path: usually all are).
    print(f"{len(differ)} of {CHAT_LINES} differ: {differ}")
    assert len(differ) <= CHAT_LINES // 10, differ
    meta = client.files.retrieve(batch.output_file_id or "")
    assert meta.purpose == "batch_output" and meta.bytes > 0
    m = tiny.metrics()
    assert m["llamaserve_batch_lines_done_total"] >= CHAT_LINES - 1
    assert m["llamaserve_batch_lines_failed_total"] >= 1
    assert m["llamaserve_batch_lines_running"] == 0


def test_embeddings_batch_equals_interactive_vectors(tmp_path: Path) -> None:
    server = batch_server(minilm_config(), tmp_path)
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        words = ["river", "stone", "lamp", "garden", "window", "paper", "silver", "forest"]
        bodies: list[dict[str, Any]] = [
            {"model": "x", "input": [f"{words[i % 8]} {words[j % 8]} number {i * 10 + j}"
                                     for j in range(10)]} for i in range(120)]
        started = time.monotonic()
        batch = run(client, jsonl("/v1/embeddings", bodies), "/v1/embeddings")
        elapsed = time.monotonic() - started
        assert batch.status == "completed" and batch.request_counts is not None
        assert batch.request_counts.completed == 120 and batch.error_file_id is None
        out = lines(client, batch.output_file_id)
        for i in (0, 1, 57, 119):
            ref = client.embeddings.create(model="x", input=bodies[i]["input"])
            got = out[f"req-{i}"]["response"]["body"]
            assert got["usage"] == ref.usage.model_dump()
            a = np.array([d["embedding"] for d in got["data"]])
            b = np.array([d.embedding for d in ref.data])
            # equal up to float noise: inputs packed with others run in other batch shapes
            assert np.allclose(a, b, atol=2e-4) and np.all((a * b).sum(1) > 0.99999)
        print(f"1,200 embedding inputs in {elapsed:.1f} s")
    finally:
        server.stop()


def test_completions_and_responses_batches(client: OpenAI, tiny: ServerProcess) -> None:
    bodies: dict[str, list[dict[str, Any]]] = {
        "/v1/completions": [{"model": "tiny-qwen", "prompt": f"Item {i}:", "max_tokens": 6,
                             "temperature": 0} for i in range(12)],
        "/v1/responses": [{"model": "tiny-qwen", "input": f"Item {i}?", "temperature": 0,
                           "max_output_tokens": 6, "store": False} for i in range(12)]}
    for endpoint, items in bodies.items():
        batch = run(client, jsonl(endpoint, items), endpoint)
        assert batch.status == "completed" and batch.request_counts is not None
        assert batch.request_counts.completed == len(items), batch
        out = lines(client, batch.output_file_id)
        for i in (0, len(items) - 1):
            got = out[f"req-{i}"]["response"]["body"]
            answer = httpx.post(f"{tiny.url}{endpoint}", json=items[i], timeout=60).json()
            if endpoint == "/v1/completions":
                assert got["choices"] == answer["choices"]
            else:
                assert got["object"] == "response" and got["status"] == "incomplete"
                assert [c["content"] for c in got["output"]] == \
                    [c["content"] for c in answer["output"]]
            assert got["usage"]["completion_tokens" if endpoint == "/v1/completions"
                                else "output_tokens"] == 6


def test_bad_input_is_refused_clearly(client: OpenAI, tiny: ServerProcess) -> None:
    url = tiny.base_url
    # a malformed line and a line for another endpoint: the batch fails, naming the lines
    content = jsonl("/v1/chat/completions", [chat_body(0)]) + b"{oops\n" + \
        jsonl("/v1/embeddings", [{"input": "x"}]).replace(b"req-0", b"other")
    batch = run(client, content, "/v1/chat/completions")
    assert batch.status == "failed" and batch.errors is not None and batch.failed_at
    assert [(e.line, e.code) for e in batch.errors.data or []] == [
        (2, "invalid_json_line"), (3, "mismatched_endpoint")]
    # an oversize upload: refused from its Content-Length, before the body is read
    started = time.monotonic()
    r = httpx.post(f"{url}/files", files={"file": ("big.jsonl", b"x" * (2 << 20))},
                   data={"purpose": "batch"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"
    assert time.monotonic() - started < 5

    def endless() -> Iterator[bytes]:  # chunked, no Content-Length: cut off at the limit
        boundary = b"--b0undary"
        yield boundary + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
        for _ in range(400):  # 25 MiB, 100 times the limit
            yield b"y" * 65536

    started = time.monotonic()
    with _nothing():
        r = httpx.post(f"{url}/files", content=endless(), timeout=30,
                       headers={"content-type": "multipart/form-data; boundary=b0undary"})
        assert r.status_code == 413
    print(f"endless upload refused in {time.monotonic() - started:.1f} s")
    # too many lines
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("many.jsonl", jsonl("/v1/chat/completions",
                                                      [{}] * (MAX_LINES + 1))),
                            purpose="batch")
    assert e.value.code == "too_many_lines"
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    assert e.value.param == "purpose"
    # unknown ids
    for call in (lambda: client.files.retrieve("file_nope"),
                 lambda: client.files.content("file_nope"),
                 lambda: client.files.delete("file_nope"),
                 lambda: client.batches.retrieve("batch_nope"),
                 lambda: client.batches.cancel("batch_nope"),
                 lambda: client.batches.create(input_file_id="file_nope",
                                               endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError) as nf:
            call()
        assert nf.value.body["message"].startswith("No such")  # type: ignore[index]
    f = client.files.create(file=("input.jsonl", jsonl("/v1/chat/completions",
                                                       [chat_body(0)])), purpose="batch")
    for field, value in (("endpoint", "/v1/moderations"), ("completion_window", "1h")):
        with pytest.raises(openai.BadRequestError) as e:
            client.batches.create(**{  # type: ignore[arg-type]
                "input_file_id": f.id, "endpoint": "/v1/chat/completions",
                "completion_window": "24h", field: value})
        assert e.value.param == field
    assert client.files.delete(f.id).deleted
    assert httpx.get(f"{tiny.url}/healthz").status_code == 200


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return isinstance(exc[1], httpx.HTTPError)  # the server may close the upload early


def test_cancel_twice_and_pagination(client: OpenAI, tiny: ServerProcess) -> None:
    content = jsonl("/v1/chat/completions", [chat_body(i, 200) for i in range(100)])
    f = client.files.create(file=("input.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    while client.batches.retrieve(batch.id).status == "validating":
        time.sleep(0.05)
    # an interactive request while the batch runs is served at once
    started = time.monotonic()
    r = client.chat.completions.create(**chat_body(1, 4))
    assert r.choices[0].finish_reason == "length" and time.monotonic() - started < 10
    with pytest.raises(openai.ConflictError):  # its input is in use
        client.files.delete(f.id)
    first = client.batches.cancel(batch.id)
    assert first.status in ("cancelling", "cancelled") and first.cancelling_at
    try:
        again = client.batches.cancel(batch.id)
        assert again.status in ("cancelling", "cancelled")
    except openai.ConflictError as exc:  # already cancelled
        assert exc.code == "batch_not_cancellable"
    done = wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts is not None and done.request_counts.total == 100
    assert done.request_counts.completed < 100
    out = lines(client, done.output_file_id)
    assert len(out) == done.request_counts.completed
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)
    ids = [b.id for b in client.batches.list(limit=100)]
    assert ids[0] == batch.id
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[:2] and page.has_more == (len(ids) > 2)
    after = client.batches.list(limit=100, after=page.data[-1].id)
    assert [b.id for b in after.data] == ids[2:]
    assert [b.id for b in client.batches.list(limit=1)] == ids  # the SDK pages on
    assert httpx.get(f"{tiny.url}/healthz").status_code == 200


def test_kill_9_mid_batch_resumes_and_answers_each_line_once(tmp_path: Path) -> None:
    n = 150
    cfg = tiny_qwen_config(n_seq_max=4)
    server = batch_server(cfg, tmp_path)
    client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    bodies = [chat_body(i, 16) for i in range(n)]
    f = client.files.create(file=("input.jsonl", jsonl("/v1/chat/completions", bodies)),
                            purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 60
    while True:
        counts = client.batches.retrieve(batch.id).request_counts
        if counts is not None and counts.completed >= n // 3:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    db = sqlite3.connect(tmp_path / "batches" / "batches.sqlite3")
    before = {cid: json.loads(result)["id"] for cid, result in db.execute(
        "SELECT custom_id, result FROM lines WHERE done=1")}
    db.close()
    assert n // 3 <= len(before) < n
    server = start_server(cfg, tmp_path)
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        done = wait(client, batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == n
        out = lines(client, done.output_file_id)
        assert set(out) == {f"req-{i}" for i in range(n)}
        # a line finished before the kill kept its result: it did not run again
        assert all(out[cid]["id"] == rid for cid, rid in before.items())
        for i in (0, n - 1):
            answer = httpx.post(f"{server.base_url}/chat/completions", json=bodies[i],
                                timeout=60).json()
            same_chat(out[f"req-{i}"]["response"]["body"], answer)
    finally:
        server.stop()


def test_an_interactive_request_does_not_wait_for_batch_lines(tmp_path: Path) -> None:
    """Every sequence holds a batch line when a user's request comes: a line gives its
    sequence up at once (llamaserve_sequences_suspended), the user's answer is done
    while that line still waits, and the line later carries on where it was: every batch
    answer equals the same request sent alone (Qwen2.5-Coder-0.5B, greedy)."""
    from conftest import qwen_config
    n, tokens = 3, 64
    server = batch_server(qwen_config(n_seq_max=2), tmp_path)
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        model = "qwen2.5-coder-0.5b-instruct"
        bodies = [{"model": model, "temperature": 0, "max_tokens": tokens,
                   "messages": [{"role": "user", "content": f"Count from {i} to {i + 99}."}]}
                  for i in range(n)]
        batch = hold_every_sequence(server, client, bodies, 2)
        user = {"model": model, "temperature": 0, "max_tokens": 4,
                "messages": [{"role": "user", "content": "Say hi."}]}
        answer = httpx.post(f"{server.base_url}/chat/completions", json=user, timeout=60)
        assert answer.status_code == 200
        counts = client.batches.retrieve(batch.id).request_counts
        assert counts is not None and counts.completed + counts.failed == 0  # none ended yet
        assert server.metrics()["llamaserve_sequences_suspended_total"] >= 1
        done = wait(client, batch.id)
        assert done.status == "completed", done
        out = lines(client, done.output_file_id)
        for i, body in enumerate(bodies):
            # two lines decode together, the request alone: equal up to a near-tie
            # (conftest.same_greedy_text)
            alone = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                               json={**body, "logprobs": True, "top_logprobs": 5}).json()
            got = out[f"req-{i}"]["response"]["body"]
            text = got["choices"][0]["message"]["content"]
            steps = alone["choices"][0]["logprobs"]["content"]
            assert same_greedy_text(text, [t["token"] for t in steps],
                                    [{a["token"]: a["logprob"] for a in t["top_logprobs"]}
                                     for t in steps]), (text, alone)
            if text == alone["choices"][0]["message"]["content"]:
                alone["choices"][0]["logprobs"] = None
                same_chat(got, alone)
    finally:
        server.stop()


def test_each_api_key_sees_its_own_and_queues_within_its_limit(tmp_path: Path) -> None:
    server = batch_server(tiny_qwen_config(), tmp_path, api_keys=["key-a", "key-b"],
                          batch_max_queued_lines=5)
    try:
        a = OpenAI(base_url=server.base_url, api_key="key-a", max_retries=0)
        b = OpenAI(base_url=server.base_url, api_key="key-b", max_retries=0)
        content = jsonl("/v1/chat/completions", [chat_body(i, 400) for i in range(3)])
        f = a.files.create(file=("input.jsonl", content), purpose="batch")
        with pytest.raises(openai.NotFoundError):
            b.files.retrieve(f.id)
        with pytest.raises(openai.NotFoundError):
            b.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                             completion_window="24h")
        assert [x.id for x in a.files.list()] == [f.id] and not list(b.files.list())
        first = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
        with pytest.raises(openai.RateLimitError) as e:  # 3 queued + 3 > 5
            a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                             completion_window="24h")
        assert e.value.code == "batch_queue_full"
        fb = b.files.create(file=("input.jsonl", content), purpose="batch")
        other = b.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")  # key-b's own limit
        with pytest.raises(openai.NotFoundError):
            b.batches.cancel(first.id)
        assert [x.id for x in b.batches.list()] == [other.id]
        for client, batch in ((a, first), (b, other)):
            client.batches.cancel(batch.id)
            done = wait(client, batch.id)
            if done.output_file_id:  # the output belongs to the batch's key
                with pytest.raises(openai.NotFoundError):
                    (b if client is a else a).files.content(done.output_file_id)
    finally:
        server.stop()
