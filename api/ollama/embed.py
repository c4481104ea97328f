"""``POST /api/embed`` and the older ``POST /api/embeddings``.

``/api/embed`` takes ``input`` (a string or a list of strings) and returns ``embeddings``,
L2-normalized as Ollama returns them (the same vectors as ``/v1/embeddings``), cut to
``dimensions`` (then normalized again) when asked. An input longer than the model embeds
is cut to fit unless ``truncate`` is false (then a 400). ``/api/embeddings`` takes one
``prompt`` and returns ``embedding``: the pooled vector as the model gives it, not
normalized (as Ollama's), cut to fit. ``options`` and ``keep_alive`` have no effect.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.ollama.names import resolve
from api.ollama.options import check_keep_alive
from api.ollama.timings import Timings
from api.openai.embeddings import MAX_INPUTS, encode
from api.web.errors import APIError, invalid
from api.web.gate import note_usage
from api.web.params import Body, read_json
from api.web.state import ModelState, ServerState
from engine.handle import EmbeddingShape, ModelHandle


def _inputs(raw: Any) -> list[str]:
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise invalid("input", "invalid input type: 'input' must be a string or a list of "
                      "strings")
    if len(raw) > MAX_INPUTS:
        raise invalid("input", f"'input' may hold at most {MAX_INPUTS} items, got {len(raw)}")
    for i, text in enumerate(raw):
        if not text:
            raise invalid("input", f"input[{i}] is an empty string")
    return list(raw)


def fit(model: ModelHandle, text: str, limit: int, truncate: bool, where: str) -> list[int]:
    """The text's tokens (special ones added); past ``limit``, the text is cut at a token
    boundary so that its tokens fit (or, without ``truncate``, a 400). Blocking."""
    tokens = model.tokenize(text, add_special=True)
    if len(tokens) <= limit:
        return tokens
    if not truncate:
        raise APIError(f"the input length exceeds the context length ({len(tokens)} tokens; "
                       f"this model embeds at most {limit})", param=where,
                       code="context_length_exceeded")
    bare = model.tokenize(text, add_special=False)
    keep = limit - (len(tokens) - len(bare))
    while keep > 0:  # detokenizing and tokenizing again may merge differently: re-check
        cut = model.tokenize(model.detokenize(bare[:keep]), add_special=True)
        if len(cut) <= limit:
            return cut
        keep -= len(cut) - limit
    raise APIError("input after truncation exceeds maximum context length", param=where,
                   code="context_length_exceeded")


def _fit_all(model: ModelHandle, texts: list[str], limit: int,
             truncate: bool) -> list[list[int]]:
    return [fit(model, t, limit, truncate, f"input[{i}]" if len(texts) > 1 else "input")
            for i, t in enumerate(texts)]


def _shape(state: ModelState) -> EmbeddingShape:
    shape = state.model.embeddings
    if shape is None:
        raise APIError(f"\"{state.model_name}\" does not support embeddings (set "
                       "model.embedding: true in the server config)", param="model",
                       code="embeddings_disabled")
    return shape


async def _route(request: Request) -> tuple[Body, ModelState, Timings, str]:
    timings = Timings()
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    resolved = resolve(server.registry, body.data.get("model"))
    check_keep_alive(body.data.get("keep_alive"))
    if body.data.get("options") is not None:
        body.obj("options")  # accepted (an object) and ignored
    state = await server.registry.acquire(resolved.entry, request.scope)
    timings.model_ready()
    return body, state, timings, str(body.data["model"])


async def embed(request: Request) -> Response:
    body, state, timings, name = await _route(request)
    texts = _inputs(body.data.get("input"))
    truncate = body.boolean("truncate", True)
    dimensions = body.integer("dimensions", None, 0)
    shape = _shape(state)
    if not texts:
        return JSONResponse({"model": name, "embeddings": []})
    tokens = await state.client.tokenize(_fit_all, state.model, texts, shape.max_input,
                                         truncate, texts=texts)
    vectors = await state.client.embed(tokens)
    timings.finish()
    n_tokens = sum(len(t) for t in tokens)
    note_usage(request.scope, state.model_name, n_tokens, 0)
    cut = dimensions if dimensions and dimensions < shape.dimensions else None
    metrics = timings.metrics(n_tokens, 0)
    return JSONResponse({"model": name, "embeddings": encode(vectors, cut, "float"),
                         "total_duration": metrics["total_duration"],
                         "load_duration": metrics["load_duration"],
                         "prompt_eval_count": n_tokens})


async def embeddings(request: Request) -> Response:
    body, state, _, _ = await _route(request)
    prompt = body.string("prompt") or ""
    shape = _shape(state)
    if not prompt:
        return JSONResponse({"embedding": []})
    tokens = await state.client.tokenize(fit, state.model, prompt, shape.max_input, True,
                                         "prompt", texts=[prompt])
    vectors = await state.client.embed([tokens])
    note_usage(request.scope, state.model_name, len(tokens), 0)
    return JSONResponse({"embedding": [float(x) for x in vectors[0]]})
