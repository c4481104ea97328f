"""What every route handler needs, built once at start-up."""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass, field

from api.body import BodyLimits
from api.engine_client import EngineClient
from api.errors import APIError
from api.gate import GateState
from api.lora import Adapters, request_adapters
from api.media import MediaRefs, media_policy
from api.media_fetch import MediaPolicy
from api.params import Body
from api.reasoning_seal import ReasoningSeal
from api.response_store import ResponseStore
from engine.config import Config
from engine.media.projector import Projector
from engine.runner import Runner
from parsers.chat_template import ChatTemplate
from parsers.response_schema import StreamLayout


@dataclass
class ServerState:
    config: Config
    client: EngineClient
    model_name: str
    template: ChatTemplate | None
    layout: StreamLayout = field(default_factory=StreamLayout)  # from model.response_schema
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(1000, 1 << 26, 3600))
    gate: GateState = field(default_factory=GateState)
    created: int = field(default_factory=lambda: int(time.time()))
    seal: ReasoningSeal = field(default_factory=lambda: ReasoningSeal(None, ""))

    @property
    def runner(self) -> Runner:
        return self.client.engine.runner

    @property
    def projector(self) -> Projector | None:
        return self.client.engine.projector

    @functools.cached_property
    def media_policy(self) -> MediaPolicy | None:
        """Where media may come from (built once; a bad entry fails the start)."""
        mtmd = self.config.model.mtmd
        return None if mtmd is None else media_policy(mtmd)

    def adapters(self, body: Body) -> Adapters:
        """The LoRA set a request runs under (``api.lora``); 400 for an unknown one."""
        engine = self.client.engine
        loaded = [x for x in self.config.model.loras if x.name in engine.runner.adapters]
        return request_adapters(body, loaded, engine.default_adapters)

    def media_refs(self) -> MediaRefs | None:
        """A collector for one request's images and audio (None: no projector, media parts
        become placeholders)."""
        mtmd = self.config.model.mtmd
        if self.projector is None or mtmd is None:
            return None
        return MediaRefs(mtmd.max_media_per_request)

    def require_generative(self) -> None:
        """An embedding-only model cannot complete text: a 400 for chat/completions."""
        if self.runner.embedding_only:
            raise APIError(f"{self.model_name} is an embedding model: it serves /v1/embeddings, "
                           "not text generation", param="model", code="model_not_generative")

    def require_chat(self) -> None:
        """A model that can chat: generative and with a chat template (else a 400)."""
        self.require_generative()
        if self.template is None:
            raise APIError("This model has no chat template; set model.chat_template in the "
                           "config or use /v1/completions", code="no_chat_template")

    @property
    def max_body_bytes(self) -> int:
        return self.config.server.max_body_bytes

    @property
    def body_limits(self) -> BodyLimits:
        s = self.config.server
        return BodyLimits(max_bytes=s.max_body_bytes, max_depth=s.max_json_depth,
                          max_string=s.max_string_length, max_items=s.max_array_length,
                          max_number=s.max_number_length, timeout=s.body_timeout)

    @property
    def max_n(self) -> int:
        return self.config.server.max_n


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"
