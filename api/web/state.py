"""What every route handler needs: the server-wide state, and one model's state.

``ServerState`` is built once at start-up (config, the response store, the gate, the
model registry). A handler reads its body, then asks ``ServerState.route`` for the
``ModelState`` of the model the request names: its engine client, template, layout and
per-model helpers, loaded on demand (``api.web.registry``).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from api.media.fetch import MediaPolicy
from api.media.parts import MediaRefs, media_policy
from api.responses.reasoning_seal import ReasoningSeal
from api.responses.store import MemoryResponseStore, ResponseStore
from api.web.body import BodyLimits
from api.web.engine_client import EngineClient
from api.web.errors import APIError
from api.web.gate import GateState
from api.web.lora import Adapters, request_adapters
from api.web.params import Body
from engine.config import Config, ModelConfig
from engine.handle import ModelHandle
from parsers.chat_template import ChatTemplate
from parsers.response_schema import StreamLayout

if TYPE_CHECKING:
    from api.web.registry import ModelRegistry


@dataclass
class ServerState:
    config: Config
    registry: ModelRegistry
    responses: ResponseStore = field(
        default_factory=lambda: MemoryResponseStore(1000, 1 << 26, 3600))
    gate: GateState = field(default_factory=GateState)
    created: int = field(default_factory=lambda: int(time.time()))
    seal: ReasoningSeal = field(default_factory=lambda: ReasoningSeal(None, ""))
    http_registry: Any = None  # prometheus registry of the HTTP metrics (api.web.gate)
    pullable: tuple[str, ...] = ()  # names `llamaserve pull` fetches (Ollama's /api/pull)
    batches: Any = None  # api.batch.runner.BatchService with server.batch_dir, else None
    background: Any = None  # api.responses.background.BackgroundRuns

    def start(self) -> None:
        """Start the first model's engine and the idle unloader (in the event loop)."""
        self.default.client.start()
        self.registry.start()
        if self.batches is not None:
            self.batches.start()
        if self.background is not None:
            self.background.start()

    async def route(self, model: Any, scope: MutableMapping[str, Any] | None = None) -> ModelState:
        """The model a request's ``model`` field names (loaded if it is not). No name: the
        first model. An adapter's name: its model. With a ``models`` list, an unknown name
        is a 404 ``model_not_found``; a single ``model`` serves any name. With the request's
        ASGI ``scope``, the model stays loaded until the response has been sent."""
        return await self.registry.acquire(self.registry.resolve(model), scope)

    @property
    def default(self) -> ModelState:
        """The first model, loaded (single-model servers and model-less routes)."""
        state = self.registry.loaded(self.registry.first)
        if state is None:
            raise APIError("The model is not loaded", status=503, code="loading")
        return state

    @property
    def body_limits(self) -> BodyLimits:
        s = self.config.server
        return BodyLimits(max_bytes=s.max_body_bytes, max_depth=s.max_json_depth,
                          max_string=s.max_string_length, max_items=s.max_array_length,
                          max_number=s.max_number_length, timeout=s.body_timeout)

    @property
    def max_body_bytes(self) -> int:
        return self.config.server.max_body_bytes

    @property
    def max_n(self) -> int:
        return self.config.server.max_n


@dataclass
class ModelState:
    """One loaded model, with the server-wide state a handler also needs."""

    server: ServerState
    model_config: ModelConfig
    client: EngineClient
    template: ChatTemplate | None
    layout: StreamLayout = field(default_factory=StreamLayout)  # from model.response_schema

    @property
    def model_name(self) -> str:
        return self.model_config.served_name()

    @property
    def model(self) -> ModelHandle:
        """The model itself (tokenizer, limits, generation): ``engine.handle``."""
        return self.client.model

    # the server-wide parts, so handlers read one object
    @property
    def config(self) -> Config:
        return self.server.config

    @property
    def responses(self) -> ResponseStore:
        return self.server.responses

    @property
    def gate(self) -> GateState:
        return self.server.gate

    @property
    def created(self) -> int:
        return self.server.created

    @property
    def seal(self) -> ReasoningSeal:
        return self.server.seal

    @property
    def body_limits(self) -> BodyLimits:
        return self.server.body_limits

    @property
    def max_n(self) -> int:
        return self.server.max_n

    # -- this model --------------------------------------------------------------------
    @functools.cached_property
    def media_policy(self) -> MediaPolicy | None:
        """Where media may come from (built once; a bad entry fails the start)."""
        mtmd = self.model_config.mtmd
        return None if mtmd is None else media_policy(mtmd)

    def adapters(self, body: Body) -> Adapters:
        """The LoRA set a request runs under (``api.web.lora``); 400 for an unknown one."""
        model = self.model
        loaded = [x for x in self.model_config.loras if x.name in model.adapter_names]
        return request_adapters(body, loaded, model.default_adapters)

    def media_refs(self) -> MediaRefs | None:
        """A collector for one request's images and audio (None: no projector, media parts
        become placeholders)."""
        mtmd = self.model_config.mtmd
        if self.model.media is None or mtmd is None:
            return None
        return MediaRefs(mtmd.max_media_per_request)

    def require_generative(self) -> None:
        """An embedding-only model cannot complete text: a 400 for chat/completions."""
        if self.model.embedding_only and self.model.reranker is not None:
            raise APIError(f"{self.model_name} is a reranker: it serves /v1/rerank and "
                           "/v1/score, not text generation", param="model",
                           code="model_not_generative")
        if self.model.embedding_only:
            raise APIError(f"{self.model_name} is an embedding model: it serves /v1/embeddings, "
                           "not text generation", param="model", code="model_not_generative")

    def require_chat(self) -> None:
        """A model that can chat: generative and with a chat template (else a 400)."""
        self.require_generative()
        if self.template is None:
            raise APIError("This model has no chat template; set model.chat_template in the "
                           "config or use /v1/completions", code="no_chat_template")


def new_id(prefix: str) -> str:
    return f"{prefix}-{os.urandom(12).hex()}"
