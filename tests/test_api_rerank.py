"""/v1/rerank, /rerank and /v1/score on a real server with the two kinds of reranker GGUF
(tests/make_reranker_models.py: a BERT cross-encoder and a Qwen3-Reranker-style LLM, random
weights), next to a generation model and an embedding model for the refusals.

Scores are checked against tests/rerank_reference.py: the same GGUF's weights in a numpy
forward pass, the prompt laid out from llama-server's C++ (bench/rerank.py checks them
against llama-server itself). Random weights: the order is noise, so tests assert the
protocol and the numbers, never which document is relevant.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from rerank_reference import Reference

from conftest import (
    ServerProcess,
    minilm_config,
    reranker_config,
    start_server,
    tiny_qwen_config,
)

pytestmark = pytest.mark.model

QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital and largest city of France.",
        "The Eiffel Tower was built in 1889.",
        "Bananas are rich in potassium.",
        "Berlin is the capital of Germany.",
        "Lyon is known for its cuisine."]
# the reference's tolerance: llama.cpp keeps K/V in f16 and reads GELU from an f16 table
TOLERANCE = {"bert": 5e-3, "qwen3": 1e-3}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    models = [reranker_config("bert")["model"], reranker_config("qwen3")["model"],
              {**minilm_config()["model"], "alias": "embed"},
              {**tiny_qwen_config()["model"], "alias": "gen", "n_ctx": 1024}]
    tmp = tmp_path_factory.mktemp("rerank")
    s = start_server({"server": {"max_loaded_models": 0}, "models": models}, tmp)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def references() -> dict[str, Reference]:
    return {kind: Reference(reranker_config(kind)["model"]["path"]) for kind in ("bert", "qwen3")}


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def rerank(server: ServerProcess, kind: str, **body: Any) -> dict[str, Any]:
    r = post(server, "/v1/rerank", {"model": f"reranker-{kind}", **body})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


@pytest.mark.parametrize("kind", ["bert", "qwen3"])
def test_scores_equal_the_reference_sorted_with_usage(
        server: ServerProcess, references: dict[str, Reference], kind: str) -> None:
    out = rerank(server, kind, query=QUERY, documents=DOCS)
    ref = references[kind]
    assert out["model"] == f"reranker-{kind}" and out["id"].startswith("rerank-")
    results = out["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert r["relevance_score"] == pytest.approx(ref.score(QUERY, DOCS[r["index"]]),
                                                     abs=TOLERANCE[kind], rel=1e-3)
        assert r["document"] == {"text": DOCS[r["index"]]}  # return_documents defaults on
    n_tokens = sum(len(ref.prompt(QUERY, d)) for d in DOCS)
    assert out["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    if kind == "qwen3":
        assert all(0.0 < s < 1.0 for s in scores)  # P(yes)


def test_top_n_return_documents_and_document_objects(server: ServerProcess) -> None:
    full = rerank(server, "bert", query=QUERY, documents=DOCS)["results"]
    top = rerank(server, "bert", query=QUERY, documents=[{"text": d} for d in DOCS], top_n=2,
                 return_documents=False)["results"]
    assert top == [{k: v for k, v in r.items() if k != "document"} for r in full[:2]]
    assert len(rerank(server, "bert", query=QUERY, documents=DOCS, top_n=50)["results"]) == 5
    # llama-server's paths answer the same
    for path in ("/rerank", "/v1/reranking", "/reranking"):
        r = post(server, path, {"model": "reranker-bert", "query": QUERY, "documents": DOCS})
        assert r.json()["results"] == full


def test_score_pairs_one_to_many_and_pairwise(server: ServerProcess) -> None:
    ranked = rerank(server, "qwen3", query=QUERY, documents=DOCS)["results"]
    by_index = {r["index"]: r["relevance_score"] for r in ranked}
    r = post(server, "/v1/score", {"model": "reranker-qwen3", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [d["index"] for d in out["data"]] == list(range(5))
    assert all(d["object"] == "score" for d in out["data"])
    assert [d["score"] for d in out["data"]] == pytest.approx([by_index[i] for i in range(5)],
                                                              abs=1e-5)
    pairwise = post(server, "/v1/score", {"model": "reranker-qwen3", "text_1": [QUERY, "fruit"],
                                          "text_2": [DOCS[0], DOCS[2]]}).json()
    assert pairwise["data"][0]["score"] == pytest.approx(by_index[0], abs=1e-5)
    one = post(server, "/v1/score", {"model": "reranker-qwen3", "text_1": "fruit",
                                     "text_2": DOCS[2]}).json()
    assert pairwise["data"][1]["score"] == pytest.approx(one["data"][0]["score"], abs=1e-5)
    assert out["usage"]["prompt_tokens"] == out["usage"]["total_tokens"] > 0


@pytest.mark.parametrize("kind", ["bert", "qwen3"])
def test_concurrent_requests_are_batched_and_score_alike(server: ServerProcess,
                                                         kind: str) -> None:
    alone = [rerank(server, kind, query=f"question {i}", documents=DOCS, return_documents=False)
             for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: rerank(server, kind, query=f"question {i}",
                                                  documents=DOCS, return_documents=False),
                                 range(8)))
    for a, b in zip(alone, together, strict=True):
        assert [r["index"] for r in a["results"]] == [r["index"] for r in b["results"]]
        # float noise only (an answer mixed up with another request's is off by ~1): in
        # batches of other sizes llama.cpp's attention (flash attention, f16) sums in
        # other orders, and this random-weight model's large activations carry that to
        # up to ~0.006 (seen in runs of this test)
        assert [r["relevance_score"] for r in b["results"]] == pytest.approx(
            [r["relevance_score"] for r in a["results"]], abs=0.02)


def test_batches_pack_a_few_hundred_tokens(server: ServerProcess) -> None:
    """Every token of a batch attends over the whole batch (masked per sequence), so an
    embedding batch packs up to 512 tokens, not n_batch (2,048 here): 40 documents of
    ~60 words make more batches than n_seq_max (16) alone would."""
    docs = [" ".join(["river", "bridge", "valley", "signal"][(i + j) % 4] for j in range(60))
            for i in range(40)]

    def counts() -> tuple[float, float]:
        m = server.metrics()
        def total(name: str) -> float:
            return sum(v for k, v in m.items() if k.startswith(name) and
                       "reranker-bert" in k)
        return (total("llamaserve_embedding_batch_seconds_count"),
                total("llamaserve_embedding_tokens_total"))

    batches, tokens = counts()
    out = rerank(server, "bert", query="Which river?", documents=docs, top_n=3)
    assert len(out["results"]) == 3
    batches, tokens = (after - before for after, before in zip(counts(), (batches, tokens),
                                                                 strict=True))
    assert tokens == out["usage"]["prompt_tokens"] > 2 * 512
    assert batches >= tokens / 512 and batches > 3, (batches, tokens)


def error(server: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    return err


@pytest.mark.parametrize(("body", "param"), [
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY}, "documents"),
    ({"documents": DOCS}, "query"),
    ({"query": QUERY, "documents": "one string"}, "documents"),
    ({"query": QUERY, "documents": [1, 2]}, "documents"),
    ({"query": QUERY, "documents": [{"content": "x"}]}, "documents"),
    ({"query": QUERY, "documents": ["x"] * 10_000}, "documents"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": -3}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": "2"}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": 1.5}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": True}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "return_documents": "yes"}, "return_documents"),
    ({"query": 7, "documents": DOCS}, "query"),
])
def test_bad_rerank_bodies_are_400s_naming_the_field(server: ServerProcess,
                                                     body: dict[str, Any], param: str) -> None:
    assert error(server, "/v1/rerank", {"model": "reranker-bert", **body})["param"] == param


def test_a_document_longer_than_the_context_is_a_400(server: ServerProcess) -> None:
    long_doc = "word " * 600  # the BERT reranker reads 512 positions
    err = error(server, "/v1/rerank", {"model": "reranker-bert", "query": QUERY,
                                       "documents": ["short", long_doc]})
    assert err["code"] == "context_length_exceeded" and "documents[1]" in err["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({"text_1": QUERY}, "text_2"),
    ({"text_2": DOCS}, "text_1"),
    ({"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_2"),
    ({"text_1": QUERY, "text_2": []}, "text_2"),
    ({"text_1": [], "text_2": DOCS}, "text_1"),
    ({"text_1": QUERY, "text_2": [None]}, "text_2"),
])
def test_bad_score_bodies_are_400s(server: ServerProcess, body: dict[str, Any],
                                   param: str) -> None:
    assert error(server, "/v1/score", {"model": "reranker-qwen3", **body})["param"] == param


@pytest.mark.parametrize("model", ["gen", "embed"])
def test_models_without_rank_pooling_refuse_to_rerank(server: ServerProcess, model: str) -> None:
    for path, body in (("/v1/rerank", {"query": QUERY, "documents": DOCS}),
                       ("/v1/score", {"text_1": QUERY, "text_2": DOCS})):
        err = error(server, path, {"model": model, **body})
        assert err["code"] == "model_not_reranker" and err["param"] == "model"
        assert ("generation" if model == "gen" else "embedding") in err["message"]


def test_a_reranker_refuses_generation_and_embeddings(server: ServerProcess) -> None:
    err = error(server, "/v1/chat/completions", {
        "model": "reranker-qwen3", "messages": [{"role": "user", "content": "hi"}]})
    assert "reranker" in err["message"]
    err = error(server, "/v1/embeddings", {"model": "reranker-bert", "input": "hi"})
    assert "reranker" in err["message"]
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
