"""POST /v1/rerank (and /rerank, llama-server's /v1/reranking, /reranking) and vLLM's
POST /v1/score.

A request's documents are scored like an embedding request's inputs: one prompt per
(query, document) pair, built as llama-server builds it (``ModelHandle.rerank_prompts``,
on the prepare pool), all of them handed to the engine as one job that it packs into
batches with other requests' inputs. A score is the first value of the model's rank
pooling — the same number llama-server returns (a raw classifier logit for cross-encoders,
P(yes) for Qwen3-style rerankers); ``/v1/score`` gives the same numbers, in input order.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.rerank.request import RerankRequest, parse_rerank, parse_score
from api.web.errors import APIError
from api.web.gate import note_usage
from api.web.params import Body, read_json
from api.web.state import ModelState, ServerState, new_id
from engine.handle import ModelHandle, RerankShape


def _require_reranker(state: ModelState) -> RerankShape:
    shape = state.model.reranker
    if shape is not None:
        return shape
    kind = ("an embedding model (its pooling gives vectors, not scores)"
            if state.model.embeddings is not None else "a text generation model")
    raise APIError(f"{state.model_name} is {kind}: reranking needs a reranker GGUF (rank "
                   "pooling: a classification head, pooling_type 4)", param="model",
                   code="model_not_reranker")


def _prompts(model: ModelHandle, queries: list[str], documents: list[str]) -> list[list[int]]:
    if all(q == queries[0] for q in queries):
        return model.rerank_prompts(queries[0], documents)
    return [model.rerank_prompts(q, [d])[0] for q, d in zip(queries, documents, strict=True)]


async def _score(state: ModelState, shape: RerankShape, queries: list[str],
                 documents: list[str], param: str) -> tuple[np.ndarray, int]:
    """Scores (input order) and the prompt tokens they took."""
    prompts = await state.client.run(_prompts, state.model, queries, documents)
    for i, tokens in enumerate(prompts):
        if len(tokens) > shape.max_input:
            raise APIError(f"{param}[{i}] makes a prompt of {len(tokens)} tokens with the "
                           f"query; this model scores at most {shape.max_input} tokens per "
                           "document", param=param, code="context_length_exceeded")
        if not tokens:
            raise APIError(f"{param}[{i}] makes an empty prompt", param=param,
                           code="invalid_value")
    rows = await state.client.embed(prompts)
    return rows[:, 0], sum(len(t) for t in prompts)


def _number(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def rerank_body(req: RerankRequest, scores: np.ndarray, model: str, n_tokens: int
                ) -> dict[str, Any]:
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))[: req.top_n]
    results: list[dict[str, Any]] = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": _number(scores[i])}
        if req.return_documents:
            item["document"] = {"text": req.documents[i]}
        results.append(item)
    return {"id": new_id("rerank"), "model": model, "results": results,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


async def rerank(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    req = parse_rerank(body)
    shape = _require_reranker(state)
    scores, n_tokens = await _score(state, shape, [req.query] * len(req.documents),
                                    req.documents, "documents")
    note_usage(request.scope, state.model_name, n_tokens, 0)
    return JSONResponse(rerank_body(req, scores, state.model_name, n_tokens))


async def score(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    req = parse_score(body)
    shape = _require_reranker(state)
    scores, n_tokens = await _score(state, shape, req.queries, req.documents, "text_2")
    note_usage(request.scope, state.model_name, n_tokens, 0)
    data = [{"index": i, "object": "score", "score": _number(s)} for i, s in enumerate(scores)]
    return JSONResponse({"id": new_id("score"), "object": "list", "created": int(time.time()),
                         "model": state.model_name, "data": data,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens,
                                   "completion_tokens": 0}})
