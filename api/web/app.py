"""The Starlette application: routes, error handlers, and the engine's lifespan."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from api.anthropic.routes import count_tokens, create_message
from api.batch.routes import BATCH_ROUTES
from api.batch.runner import BatchService
from api.ollama.routes import OLLAMA_ROUTES
from api.openai.chat import create_chat_completion
from api.openai.completions import create_completion
from api.openai.embeddings import create_embedding
from api.openai.infill import infill
from api.openai.models import list_models, retrieve_model
from api.openai.tokenize import apply_template, detokenize, tokenize
from api.rerank.routes import rerank, score
from api.responses.background import BackgroundRuns
from api.responses.conversations import CONVERSATION_ROUTES
from api.responses.reasoning_seal import ReasoningSeal
from api.responses.routes import (
    cancel_response,
    count_input_tokens,
    create_response,
    delete_response,
    get_response,
    list_input_items,
    resume_background,
)
from api.responses.store import open_response_store
from api.responses.websocket import responses_websocket
from api.web.capture import Capture, capture_directory
from api.web.engine_client import EngineClient
from api.web.errors import APIError, api_error_handler, http_error_handler, unhandled_error_handler
from api.web.gate import Gate, HttpMetrics
from api.web.playground import playground
from api.web.registry import ModelRegistry
from api.web.state import ModelState, ServerState
from engine.config import Config, ModelConfig
from engine.handle import ModelHandle
from parsers.chat_template import ChatTemplate, TemplateError
from parsers.families import detect
from parsers.response_schema import SchemaError, StreamLayout, stream_layout
from parsers.template_probe import derive

log = logging.getLogger("llamaserve.models")


def load_layout(cfg: ModelConfig, template: ChatTemplate | None = None) -> StreamLayout:
    """The markup the parser and the grammars read: the config's ``response_schema``, else
    the family its chat template writes (``parsers/families.py``), else one derived from
    the template's own rendering of probe calls (``parsers/template_probe.py``), else
    plain content."""
    schema = cfg.response_schema
    if schema:
        try:
            return stream_layout(schema)
        except SchemaError as exc:
            raise ValueError(f"model.response_schema: {exc}") from exc
    if template is None:
        return StreamLayout()
    family = detect(template.source)
    if family is not None:
        log.info("%s: chat template of the %s family (%s): reasoning and tool calls read "
                 "from its markup", cfg.served_name(), family.name, family.models)
    else:
        derived = derive(template)
        family = derived.family
        if family is None:
            log.warning("%s: no known tool-call markup in its chat template, and none could "
                        "be derived (%s): everything it writes is content "
                        "(model.response_schema can describe it)", cfg.served_name(),
                        derived.why)
            return StreamLayout()
        log.info("%s: tool calls and reasoning read from markup derived from its chat "
                 "template: %s", cfg.served_name(), json.dumps(family.schema))
    try:
        return replace(stream_layout(family.schema), name=family.name, shape=family.shape)
    except SchemaError as exc:  # a derived schema the stream parser cannot follow
        log.warning("%s: the markup derived from its chat template cannot be streamed "
                    "(%s): everything it writes is content", cfg.served_name(), exc)
        return StreamLayout()


def marker_tokens(model: ModelHandle, layout: StreamLayout) -> frozenset[int]:
    """Control tokens whose text a marker needs (rendered for the parser; other control
    tokens, such as end-of-turn, never reach the text)."""
    ids = set()
    for marker in (layout.reasoning_start, layout.reasoning_end, layout.call_start,
                   layout.call_end, layout.block_start, layout.block_end, *layout.markers):
        if marker:
            for token in model.tokenize(marker, add_special=False, parse_special=True):
                if not model.piece(token) and model.piece(token, special=True):
                    ids.add(token)
    return frozenset(ids)


async def healthz(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    for state in server.registry.loaded_states():
        model = state.model
        if not model.alive and model.failure is not None:
            return JSONResponse({"status": "error", "model": state.model_name,
                                 "reason": model.failure}, status_code=503)
    if server.gate.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ok", "model": server.registry.first})


async def metrics(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    return Response(server_metrics(server), media_type=CONTENT_TYPE_LATEST)


def server_metrics(server: ServerState) -> bytes:
    """One model: its engine's registry (which also holds the HTTP metrics), as always.
    Several: the server's HTTP metrics, then every loaded engine's series with a
    ``model`` label, and ``llamaserve_model_loaded``."""
    if not server.config.several:
        first = server.registry.loaded(server.registry.first)
        return generate_latest(server.http_registry if first is None
                               else first.model.metrics_registry)
    out = [generate_latest(server.http_registry).decode()]
    seen: set[str] = set()
    lines = ["# HELP llamaserve_model_loaded Whether the model is loaded (1) or not (0).",
             "# TYPE llamaserve_model_loaded gauge"]
    for entry in server.registry.entries.values():
        loaded = int(entry.state is not None)
        lines.append(f'llamaserve_model_loaded{{model="{_escape(entry.name)}"}} {loaded}')
        if entry.state is None:
            continue
        text = generate_latest(entry.state.model.metrics_registry).decode()
        for line in text.splitlines():
            if line.startswith("#"):
                if line not in seen:
                    seen.add(line)
                    lines.append(line)
                continue
            name, _, rest = line.partition(" ")
            label = f'model="{_escape(entry.name)}"'
            name = name.replace("{", "{" + label + ",", 1) if "{" in name \
                else f"{name}{{{label}}}"
            lines.append(f"{name} {rest}")
    out.append("\n".join(lines) + "\n")
    return "".join(out).encode()


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def load_template(cfg: ModelConfig, model: ModelHandle) -> ChatTemplate | None:
    source = cfg.chat_template or model.chat_template()
    if not source:
        return None
    try:
        return ChatTemplate(source, bos_token=model.special_token_text("bos"),
                            eos_token=model.special_token_text("eos"))
    except TemplateError as exc:
        raise ValueError(f"model.chat_template: {exc}") from exc


def model_state(server: ServerState, cfg: ModelConfig, model: ModelHandle) -> ModelState:
    """A loaded model as handlers see it: its engine client, template and layout."""
    s = server.config.server
    client = EngineClient(model, workers=s.prepare_workers, max_queue=s.max_queue,
                          request_timeout=s.request_timeout, max_buffered=s.max_buffered_steps,
                          clamp_max_tokens=s.clamp_max_tokens)
    template = load_template(cfg, model)
    state = ModelState(server, cfg, client, template=template,
                       layout=load_layout(cfg, template))
    model.render_special(marker_tokens(model, state.layout))
    _ = state.media_policy  # a bad model.mtmd domain or network fails the load here
    return state


def build_app(config: Config, model: ModelHandle, manage_engine: bool = True,
              load_model: Callable[[ModelConfig], ModelHandle] | None = None,
              pullable: Sequence[str] = ()) -> Starlette:
    """The Starlette app around the first model (already loaded: its engine's handle);
    ``load_model`` loads the others of a ``models`` list on demand. With
    ``manage_engine`` its lifespan starts and stops the engines; ``api.web.lifecycle`` does
    that itself (the model loads after the port opens). ``pullable``: the model names
    ``llamaserve pull`` knows (Ollama's ``/api/pull`` names them)."""
    server = ServerState(config=config, registry=None,  # type: ignore[arg-type]
                         responses=open_response_store(
                             config.server.responses_store_path,
                             config.server.responses_store_max,
                             config.server.responses_store_max_bytes,
                             config.server.responses_store_ttl),
                         seal=ReasoningSeal(config.server.reasoning_key
                                            or os.environ.get("LLAMASERVE_REASONING_KEY"),
                                            config.model.served_name()),
                         pullable=tuple(pullable))

    def load(cfg: ModelConfig) -> ModelState:
        if load_model is None:
            raise RuntimeError("this server was built without a model loader")
        return model_state(server, cfg, load_model(cfg))

    server.background = BackgroundRuns(
        server.responses, lambda stored, claim: resume_background(server, stored, claim))
    server.registry = ModelRegistry(config, load)
    server.registry.adopt(model_state(server, config.model, model))
    # HTTP metrics: in the engine's registry with one model (as before), else the server's
    server.http_registry = model.metrics_registry if not config.several \
        else CollectorRegistry()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_engine:
            server.start()
        try:
            yield
        finally:
            if server.batches is not None:
                server.batches.stop()
            server.background.stop()
            if manage_engine:
                server.registry.stop()

    routes = [
        Route("/v1/completions", create_completion, methods=["POST"]),
        Route("/", playground, methods=["GET"]),
        Route("/infill", infill, methods=["POST"]),
        Route("/v1/messages", create_message, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/embeddings", create_embedding, methods=["POST"]),
        *[Route(path, rerank, methods=["POST"])
          for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")],
        Route("/v1/score", score, methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        WebSocketRoute("/v1/responses", responses_websocket),
        Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
        *CONVERSATION_ROUTES,
        Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"]),
        Route("/v1/tokenize", tokenize, methods=["POST"]),
        Route("/v1/detokenize", detokenize, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/health", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *OLLAMA_ROUTES,
        *BATCH_ROUTES,
    ]
    middleware = []
    if (capture := capture_directory()) is not None:
        middleware.append(Middleware(Capture, directory=capture))
    if config.server.cors is not None:
        cors = config.server.cors
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(cors.allow_origins),
            allow_methods=list(cors.allow_methods), allow_headers=list(cors.allow_headers),
            allow_credentials=cors.allow_credentials))
    middleware.append(Middleware(Gate, cfg=config.server,
                                 metrics=HttpMetrics(server.http_registry), state=server.gate))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={
        APIError: api_error_handler,
        HTTPException: http_error_handler,
        Exception: unhandled_error_handler,
    })
    app.state.llama = server
    if config.server.batch_dir is not None:
        server.batches = BatchService(server, app, config.server, server.http_registry)
    return app
