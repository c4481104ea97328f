"""The Starlette application: routes, error handlers, and the engine's lifespan."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from api.anthropic import count_tokens, create_message
from api.chat import create_chat_completion
from api.completions import create_completion
from api.embeddings import create_embedding
from api.engine_client import EngineClient
from api.errors import APIError, api_error_handler, http_error_handler, unhandled_error_handler
from api.gate import Gate, HttpMetrics
from api.infill import infill
from api.lora import adapter_scale
from api.playground import playground
from api.reasoning_seal import ReasoningSeal
from api.response_store import ResponseStore
from api.responses import create_response, delete_response, get_response
from api.responses_ws import responses_websocket
from api.state import ServerState
from api.tokenize import detokenize, tokenize
from engine.config import Config
from engine.core import Engine
from engine.runner import Runner
from parsers.chat_template import ChatTemplate, TemplateError
from parsers.response_schema import SchemaError, StreamLayout, stream_layout


def load_layout(config: Config) -> StreamLayout:
    schema = config.model.response_schema
    if not schema:
        return StreamLayout()  # everything the model writes is content
    try:
        return stream_layout(schema)
    except SchemaError as exc:
        raise ValueError(f"model.response_schema: {exc}") from exc


def marker_tokens(runner: Runner, layout: StreamLayout) -> frozenset[int]:
    """Control tokens whose text a marker needs (rendered for the parser; other control
    tokens, such as end-of-turn, never reach the text)."""
    ids = set()
    for marker in (layout.reasoning_start, layout.reasoning_end, layout.call_start,
                   layout.call_end):
        if marker:
            for token in runner.tokenize(marker, add_special=False, parse_special=True):
                if not runner.piece(token) and runner.piece(token, special=True):
                    ids.add(token)
    return frozenset(ids)


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.llama
    runner = state.runner
    meta: dict[str, Any] = {"n_ctx": runner.n_ctx, "n_ctx_seq": runner.n_ctx_seq,
                            "n_seq_max": runner.n_seq_max}
    if state.projector is not None:
        meta["input_modalities"] = ["text", *(["image"] if state.projector.vision else []),
                                    *(["audio"] if state.projector.audio else [])]
    loaded = [x for x in state.config.model.loras if x.name in runner.adapters]
    if loaded:
        meta["lora"] = [{"id": i, "name": x.name, "scale": x.scale}
                        for i, x in enumerate(loaded)]
    data = [{"id": state.model_name, "object": "model", "created": state.created,
             "owned_by": "llamaserve", "meta": meta}]
    # one entry per adapter, as vLLM lists them: naming it as the model applies it
    data += [{"id": x.name, "object": "model", "created": state.created,
              "owned_by": "llamaserve", "root": state.model_name, "parent": state.model_name,
              "meta": {"lora": {"id": i, "scale": adapter_scale(x)}}}
             for i, x in enumerate(loaded)]
    return JSONResponse({"object": "list", "data": data})


async def healthz(request: Request) -> Response:
    state: ServerState = request.app.state.llama
    engine = state.client.engine
    if not engine.alive:
        return JSONResponse({"status": "error", "reason": engine.failure or "engine stopped"},
                            status_code=503)
    if state.gate.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ok", "model": state.model_name})


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.llama
    return Response(generate_latest(state.client.engine.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)


def load_template(config: Config, engine: Engine) -> ChatTemplate | None:
    source = config.model.chat_template or engine.runner.chat_template()
    if not source:
        return None
    try:
        return ChatTemplate(source, bos_token=engine.runner.special_token_text("bos"),
                            eos_token=engine.runner.special_token_text("eos"))
    except TemplateError as exc:
        raise ValueError(f"model.chat_template: {exc}") from exc


def build_app(config: Config, engine: Engine, manage_engine: bool = True) -> Starlette:
    """The Starlette app. With ``manage_engine`` its lifespan starts and stops the engine;
    ``api.lifecycle`` does that itself (the model loads after the port opens)."""
    client = EngineClient(engine, workers=config.server.prepare_workers,
                          max_queue=config.server.max_queue,
                          request_timeout=config.server.request_timeout,
                          max_buffered=config.server.max_buffered_steps)
    state = ServerState(config=config, client=client, model_name=config.model.served_name(),
                        template=load_template(config, engine), layout=load_layout(config),
                        responses=ResponseStore(config.server.responses_store_max,
                                                config.server.responses_store_max_bytes,
                                                config.server.responses_store_ttl),
                        seal=ReasoningSeal(config.server.reasoning_key
                                           or os.environ.get("LLAMASERVE_REASONING_KEY"),
                                           config.model.served_name()))
    engine.render_special = marker_tokens(engine.runner, state.layout)
    _ = state.media_policy  # a bad model.mtmd domain or network fails the start here

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_engine:
            client.start()
        try:
            yield
        finally:
            if manage_engine:
                client.stop()

    routes = [
        Route("/v1/completions", create_completion, methods=["POST"]),
        Route("/", playground, methods=["GET"]),
        Route("/infill", infill, methods=["POST"]),
        Route("/v1/messages", create_message, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/embeddings", create_embedding, methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        WebSocketRoute("/v1/responses", responses_websocket),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/tokenize", tokenize, methods=["POST"]),
        Route("/v1/detokenize", detokenize, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/health", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    middleware = []
    if config.server.cors is not None:
        cors = config.server.cors
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(cors.allow_origins),
            allow_methods=list(cors.allow_methods), allow_headers=list(cors.allow_headers),
            allow_credentials=cors.allow_credentials))
    middleware.append(Middleware(Gate, cfg=config.server,
                                 metrics=HttpMetrics(engine.metrics.registry), state=state.gate))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={
        APIError: api_error_handler,
        HTTPException: http_error_handler,
        Exception: unhandled_error_handler,
    })
    app.state.llama = state
    return app
