"""/v1/embeddings on the real all-MiniLM-L6-v2 (converted to GGUF) and on a generation model."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from conftest import ROOT, ServerProcess, minilm_config, qwen_config, start_server

REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "minilm_reference.json").read_text())


@pytest.fixture(scope="module")
def minilm(minilm_server: ServerProcess) -> ServerProcess:
    return minilm_server


@pytest.fixture(scope="module")
def client(minilm: ServerProcess) -> OpenAI:
    return OpenAI(base_url=minilm.base_url, api_key="unused", max_retries=0)


def post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/embeddings", json=body, timeout=60)


def test_vectors_match_sentence_transformers(client: OpenAI) -> None:
    r = client.embeddings.create(model="x", input=REFERENCE["sentences"])
    assert r.model == "all-minilm-l6-v2" and r.object == "list"
    assert [d.index for d in r.data] == list(range(len(REFERENCE["sentences"])))
    for d, ref in zip(r.data, REFERENCE["vectors"], strict=True):
        v = np.array(d.embedding)
        assert len(v) == 384 and abs(np.linalg.norm(v) - 1) < 1e-4
        assert float(v @ np.array(ref)) >= 0.99
    assert r.usage.prompt_tokens == r.usage.total_tokens > len(REFERENCE["sentences"]) * 5


def test_base64_decodes_to_the_same_floats(minilm: ServerProcess) -> None:
    text = REFERENCE["sentences"][:3]
    floats = post(minilm, {"input": text, "encoding_format": "float"}).json()["data"]
    b64 = post(minilm, {"input": text, "encoding_format": "base64"}).json()["data"]
    for f, b in zip(floats, b64, strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == np.array(f["embedding"], dtype=np.float32).tolist()


def test_dimensions_truncate_and_renormalize(client: OpenAI) -> None:
    full = np.array(client.embeddings.create(model="x", input="a red bicycle").data[0].embedding)
    short = np.array(client.embeddings.create(model="x", input="a red bicycle",
                                              dimensions=64).data[0].embedding)
    assert len(short) == 64 and abs(np.linalg.norm(short) - 1) < 1e-5
    expected = full[:64] / np.linalg.norm(full[:64])
    assert np.allclose(short, expected, atol=1e-5)


def test_batch_of_64_keeps_input_order(client: OpenAI) -> None:
    inputs = [f"Document number {i} is about topic {i * 37 % 11}." for i in range(64)]
    batch = client.embeddings.create(model="x", input=inputs)
    assert [d.index for d in batch.data] == list(range(64))
    for i in (0, 17, 63):
        alone = client.embeddings.create(model="x", input=inputs[i]).data[0].embedding
        assert float(np.dot(batch.data[i].embedding, alone)) > 0.9999


def test_token_id_inputs(minilm: ServerProcess, client: OpenAI) -> None:
    ids = httpx.post(f"{minilm.base_url}/tokenize", json={"prompt": "The cat sits on the mat."},
                     timeout=30).json()["tokens"]
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
    by_text = client.embeddings.create(model="x", input="The cat sits on the mat.")
    by_ids = client.embeddings.create(model="x", input=[ids, ids[:4]])
    assert np.allclose(by_ids.data[0].embedding, by_text.data[0].embedding, atol=1e-6)
    assert len(by_ids.data) == 2


@pytest.mark.parametrize("body, fragment", [
    ({"input": ""}, "input[0] is an empty string"),
    ({"input": ["ok", ""]}, "input[1] is an empty string"),
    ({"input": []}, "must not be an empty list"),
    ({}, "'input' is required"),
    ({"input": {"text": "x"}}, "must be a string"),
    ({"input": [1, "a"]}, "must be a string"),
    ({"input": [[1, 2], []]}, "input[1] is an empty token list"),
    ({"input": [99999999]}, "outside [0, 30522)"),
    ({"input": ["x"] * 2049}, "at most 2048"),
    ({"input": "word " * 600}, "embeds at most 512 tokens"),
    ({"input": "x", "encoding_format": "int8"}, "'float' or 'base64'"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "dimensions": 385}, "dimensions"),
])
def test_bad_inputs_are_400(minilm: ServerProcess, body: dict[str, Any], fragment: str) -> None:
    r = post(minilm, {"model": "x", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] in ("input", "encoding_format", "dimensions")


def test_embedding_model_rejects_generation(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.completions.create(model="x", prompt="hi")


def test_tokenize_detokenize_round_trip(minilm: ServerProcess) -> None:
    r = httpx.post(f"{minilm.base_url}/tokenize", json={
        "prompt": "hello embedding world", "add_special": False, "with_pieces": True},
        timeout=30).json()
    assert r["count"] == len(r["tokens"]) and len(r["pieces"]) == r["count"]
    back = httpx.post(f"{minilm.base_url}/detokenize", json={"tokens": r["tokens"]},
                      timeout=30).json()
    assert back["prompt"].strip() == "hello embedding world"


def test_generation_model_serves_embeddings_without_losing_its_cache(tmp_path: Path) -> None:
    cfg = qwen_config(embedding=True)
    server = start_server(cfg, tmp_path)
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        system = "You are a careful assistant. " + " ".join(
            f"Fact {i}: item {i} weighs {i * 3} grams." for i in range(80))

        def ask(question: str) -> int:
            r = client.chat.completions.create(
                model="x", temperature=0, max_tokens=4,
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": question}])
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            return r.usage.prompt_tokens_details.cached_tokens or 0

        ask("How heavy is item 3?")
        e = client.embeddings.create(model="x", input=["first text", "second text"] * 8)
        assert len(e.data) == 16 and len(e.data[0].embedding) == 896
        assert ask("How heavy is item 7?") > 400  # the embeddings did not wipe the KV

        # a long generation and embedding requests share the engine; neither waits for
        # the other to finish
        chunks: list[str] = []

        def generate() -> None:
            stream = client.completions.create(model="x", prompt="Count: 1, 2, 3,",
                                               max_tokens=120, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True})
            chunks.extend(c.choices[0].text for c in stream)

        worker = threading.Thread(target=generate)
        worker.start()
        while not chunks:
            threading.Event().wait(0.02)
        for _ in range(3):
            client.embeddings.create(model="x", input=["while generating"] * 32)
        assert worker.is_alive()  # embeddings finished while the stream was still going
        worker.join(120)
        assert len("".join(chunks)) > 50
    finally:
        server.stop()


def test_reject_token_id_inputs_refuses_ids_and_keeps_text(tmp_path: Path) -> None:
    """LangChain's OpenAIEmbeddings sends tiktoken ids by default; an embedding server
    that only expects text can refuse them instead of embedding the wrong tokens."""
    cfg = minilm_config(reject_token_id_inputs=True)
    server = start_server(cfg, tmp_path)
    try:
        for ids in ([101, 7592, 102], [[101, 7592, 102]]):
            r = post(server, {"input": ids})
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["code"] == "token_ids_not_accepted" and err["param"] == "input"
            assert "check_embedding_ctx_length=False" in err["message"]
        ok = post(server, {"input": ["plain text"]})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 384
    finally:
        server.stop()
