"""``GET /v1/models`` and ``GET /v1/models/{id}``: the served models and their adapters.

Each entry is OpenAI's ``Model`` (id, object, created, owned_by) plus what clients of a
local server read: ``max_model_len`` (vLLM's name for the context one request may use) and
``meta`` (context sizes, capabilities, the chat template's family, LoRA adapters)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.ollama.capabilities import capabilities
from api.web.errors import APIError
from api.web.lora import adapter_scale
from api.web.state import ServerState


def model_entries(server: ServerState) -> list[dict[str, Any]]:
    """Every served model, then each of its LoRA adapters, in the config's order."""
    data = []
    for entry in server.registry.entries.values():
        cfg, state = entry.config, entry.state
        meta: dict[str, Any] = {"loaded": state is not None}
        if state is not None:
            model = state.model
            meta.update(n_ctx=model.n_ctx, n_ctx_seq=model.n_ctx_seq,
                        n_seq_max=model.n_seq_max, capabilities=capabilities(state))
            if state.layout.name:  # the family read from its chat template
                meta["family"] = state.layout.name
            media = model.media
            if media is not None:
                meta["input_modalities"] = ["text", *(["image"] if media.vision else []),
                                            *(["audio"] if media.audio else [])]
        if cfg.loras:
            meta["lora"] = [{"id": i, "name": x.name, "scale": x.scale}
                            for i, x in enumerate(cfg.loras)]
        item = {"id": entry.name, "object": "model", "created": server.created,
                "owned_by": "llamaserve", "meta": meta}
        if state is not None:  # vLLM's field: the context one request may use
            item["max_model_len"] = state.model.n_ctx_seq
        data.append(item)
        # one entry per adapter, as vLLM lists them: naming it as the model applies it
        data += [{"id": x.name, "object": "model", "created": server.created,
                  "owned_by": "llamaserve", "root": entry.name, "parent": entry.name,
                  "meta": {"lora": {"id": i, "scale": adapter_scale(x)}}}
                 for i, x in enumerate(cfg.loras)]
    return data


async def list_models(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    return JSONResponse({"object": "list", "data": model_entries(server)})


async def retrieve_model(request: Request) -> Response:
    """One entry of the list by its id (the OpenAI SDK's ``client.models.retrieve``)."""
    server: ServerState = request.app.state.llama
    model_id = request.path_params["model_id"]
    for item in model_entries(server):
        if item["id"] == model_id:
            return JSONResponse(item)
    raise APIError(f"The model '{model_id[:200]}' does not exist", status=404, param="model",
                   code="model_not_found", type="invalid_request_error")
