"""POST /v1/embeddings."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.web.errors import APIError, invalid
from api.web.gate import note_usage
from api.web.params import Body, read_json
from api.web.state import ServerState
from engine.handle import ModelHandle

MAX_INPUTS = 2048  # OpenAI's limit per request


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_input(body: Body, n_vocab: int, *, reject_ids: bool = False
                ) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token lists); 400 for anything else. ``reject_ids``
    (``model.reject_token_id_inputs``): token ids are refused, since ids made by another
    tokenizer (tiktoken, as LangChain's OpenAIEmbeddings sends by default) would be
    embedded as this model's tokens — silently wrong vectors."""
    raw = body.data.get("input")
    shape = ("'input' must be a string, a list of strings, a list of token ids, or a list of "
             "token-id lists")
    texts: list[str] | None = None
    token_lists: list[list[int]] | None = None
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and raw:
        if all(isinstance(x, str) for x in raw):
            texts = list(raw)
        elif all(_is_id(x) for x in raw):
            token_lists = [list(raw)]
        elif all(isinstance(x, list) and all(_is_id(t) for t in x) for x in raw):
            token_lists = [list(x) for x in raw]
        else:
            raise invalid("input", shape)
    elif raw is None:
        raise invalid("input", "'input' is required")
    elif isinstance(raw, list):
        raise invalid("input", "'input' must not be an empty list")
    else:
        raise invalid("input", shape)
    if token_lists is not None and reject_ids:
        raise APIError("this server embeds text only (model.reject_token_id_inputs): send "
                       "strings, not token ids (LangChain: OpenAIEmbeddings("
                       "check_embedding_ctx_length=False))", param="input",
                       code="token_ids_not_accepted")
    count = len(texts if texts is not None else token_lists or [])
    if count > MAX_INPUTS:
        raise invalid("input", f"'input' may hold at most {MAX_INPUTS} items, got {count}")
    for i, text in enumerate(texts or []):
        if not text:
            raise invalid("input", f"input[{i}] is an empty string")
    for i, tokens in enumerate(token_lists or []):
        if not tokens:
            raise invalid("input", f"input[{i}] is an empty token list")
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise invalid("input", f"input[{i}] holds token id {bad}, outside [0, {n_vocab})")
    return texts, token_lists


def _tokenize_all(model: ModelHandle, texts: list[str]) -> list[list[int]]:
    return [model.tokenize(t, add_special=True) for t in texts]


def encode(vectors: np.ndarray, dimensions: int | None, fmt: str) -> list[Any]:
    """Truncate to ``dimensions`` (if asked), L2-normalize, then floats or base64 of
    little-endian float32 (what the OpenAI SDK decodes)."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = (vectors / np.maximum(norms, 1e-12)).astype("<f4")
    if fmt == "base64":
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in unit]
    return [row.tolist() for row in unit]


async def create_embedding(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    state = await server.route(body.data.get("model"), request.scope)
    shape = state.model.embeddings
    if shape is None and state.model.reranker is not None:
        raise APIError(f"{state.model_name} is a reranker: it scores documents at /v1/rerank "
                       "and /v1/score, it has no embeddings", param="model",
                       code="embeddings_disabled")
    if shape is None:
        raise APIError("This model does not serve embeddings; set model.embedding: true in the "
                       "server config", param="model", code="embeddings_disabled")
    fmt = body.string("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise invalid("encoding_format", "'encoding_format' must be 'float' or 'base64'")
    dimensions = body.integer("dimensions", None, 1, shape.dimensions)
    texts, token_lists = parse_input(body, state.model.n_vocab,
                                     reject_ids=state.model_config.reject_token_id_inputs)
    if texts is not None:
        token_lists = await state.client.tokenize(_tokenize_all, state.model, texts,
                                                  texts=texts)
    assert token_lists is not None
    for i, tokens in enumerate(token_lists):
        if len(tokens) > shape.max_input:
            raise APIError(f"input[{i}] has {len(tokens)} tokens; this model embeds at most "
                           f"{shape.max_input} tokens per input", param="input",
                           code="context_length_exceeded")
    vectors = await state.client.embed(token_lists)
    data = [{"object": "embedding", "index": i, "embedding": e}
            for i, e in enumerate(encode(vectors, dimensions, fmt))]
    n_tokens = sum(len(t) for t in token_lists)
    note_usage(request.scope, state.model_name, n_tokens, 0)
    return JSONResponse({"object": "list", "data": data, "model": state.model_name,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})
