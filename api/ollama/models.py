"""Ollama's model routes: ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version`` and
``/api/pull``, answered from the server's config.

The models are the configured ones (each LoRA adapter listed too, as the model it
applies); names carry Ollama's ``:latest`` tag. ``size`` is the files' bytes (``/api/ps``:
plus the KV cache); ``digest`` identifies the file (its path, size and modification
time), it is not a hash of its contents. ``/api/show`` loads the model if it is not
loaded. ``/api/pull`` downloads nothing: a configured model answers ``success``, any
other name a 404 that lists the configured models and the names ``llamaserve pull``
fetches.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import os
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.ollama.capabilities import capabilities, details
from api.ollama.names import listed_name, resolve
from api.ollama.ndjson import line, ndjson_response
from api.ollama.options import stream_flag
from api.web.errors import APIError
from api.web.params import Body, read_json
from api.web.registry import file_bytes, measured_bytes
from api.web.state import ServerState
from engine.config import ModelConfig

OLLAMA_VERSION = "0.12.0"  # the Ollama API this server follows (clients gate features on it)
NEVER = "9999-12-31T23:59:59Z"  # expires_at of a model that is never unloaded when idle


def _stamp(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _file(cfg: ModelConfig) -> tuple[float, int]:
    """(modification time, nanoseconds) of the model's file; (0, 0) when it has none."""
    try:
        st = os.stat(cfg.path) if cfg.path else None
    except OSError:
        st = None
    return (st.st_mtime, st.st_mtime_ns) if st is not None else (0.0, 0)


def _digest(cfg: ModelConfig) -> str:
    _, mtime_ns = _file(cfg)
    key = f"{cfg.served_name()}\0{cfg.path}\0{file_bytes(cfg)}\0{mtime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()


def _entry(server: ServerState, cfg: ModelConfig, name: str, parent: str = ""
           ) -> dict[str, Any]:
    mtime, _ = _file(cfg)
    listed = listed_name(name)
    return {"name": listed, "model": listed, "modified_at": _stamp(mtime or server.created),
            "size": file_bytes(cfg), "digest": _digest(cfg),
            "details": details(cfg.path, listed_name(parent) if parent else "")}


async def tags(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    models = []
    for entry in server.registry.entries.values():
        models.append(_entry(server, entry.config, entry.name))
        models += [_entry(server, entry.config, x.name, entry.name) for x in entry.config.loras]
    return JSONResponse({"models": models})


async def ps(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    idle = server.config.server.model_idle_seconds
    models = []
    for entry in server.registry.entries.values():
        state = entry.state
        if state is None:
            continue
        # idle unloading (server.model_idle_seconds) is the only expiry here
        last_used = time.time() - (time.monotonic() - entry.last_used)
        models.append({**_entry(server, entry.config, entry.name),
                       "size": measured_bytes(state), "size_vram": 0,
                       "expires_at": NEVER if idle <= 0 else _stamp(last_used + idle),
                       "context_length": state.model.n_ctx_seq})
    return JSONResponse({"models": models})


async def version(request: Request) -> Response:
    try:
        own = importlib.metadata.version("llamaserve")
    except importlib.metadata.PackageNotFoundError:
        own = "unknown"
    return JSONResponse({"version": OLLAMA_VERSION, "llamaserve": own})


async def show(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    name = body.data.get("model") or body.data.get("name")
    resolved = resolve(server.registry, name)
    state = await server.registry.acquire(resolved.entry, request.scope)
    cfg = state.model_config
    parent = state.model_name if resolved.matched != resolved.entry else ""
    mtime, _ = _file(cfg)
    return JSONResponse({
        "license": "",
        "modelfile": f"# served by llamaserve: configured in its JSON config, not a "
                     f"Modelfile\nFROM {listed_name(resolved.matched)}\n",
        "parameters": f"num_ctx {state.model.n_ctx_seq}",
        "template": state.template.source if state.template is not None else "",
        "details": details(cfg.path, listed_name(parent) if parent else ""),
        "model_info": model_info(await state.client.run(state.model.metadata)),
        "capabilities": capabilities(state),
        "modified_at": _stamp(mtime or server.created),
    })


# what Ollama answers for the GGUF's arrays without `verbose` (llama.cpp keeps none of them)
_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


def model_info(meta: dict[str, str]) -> dict[str, Any]:
    """The GGUF's metadata as Ollama's ``/api/show`` gives it: typed values under their GGUF
    keys (clients read ``<architecture>.context_length`` from it); the chat template is
    ``template``, not here."""
    info: dict[str, Any] = {}
    for key, raw in sorted(meta.items()):
        if key.startswith("tokenizer.chat_template"):
            continue
        info[key] = _typed(raw)
    if "general.architecture" in info:
        info.update({key: None for key in _ARRAYS})
    return info


_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]*(e[-+]?[0-9]+)?")  # as llama.cpp prints GGUF floats


def _typed(raw: str) -> Any:
    """llama.cpp's string of a GGUF value back to its JSON type (a string stays one)."""
    if raw in ("true", "false"):
        return raw == "true"
    if len(raw) > 40:  # no GGUF number is this long (and int() refuses 4,300+ digits)
        return raw
    if _INT.fullmatch(raw):
        return int(raw)
    if _FLOAT.fullmatch(raw):
        return float(raw)
    return raw


async def pull(request: Request) -> Response:
    server: ServerState = request.app.state.llama
    body = Body(await read_json(request, server.body_limits))
    stream = stream_flag(body)
    name = body.data.get("model") or body.data.get("name")
    try:
        resolved = resolve(server.registry, name)
    except APIError as exc:
        if exc.status != 404:
            raise
        configured = ", ".join(listed_name(n) for n in server.registry.entries)
        fetchable = ", ".join(server.pullable) or "none"
        raise APIError(f"model '{str(name)[:200]}' is not configured on this server, which "
                       f"does not download models. Configured: {configured}. "
                       f"`llamaserve pull NAME` fetches these into the model cache: "
                       f"{fetchable}; then add the model to the server's config.",
                       status=404, param="model", code="model_not_found") from None
    lines = [{"status": f"{listed_name(resolved.matched)} is configured on this server"},
             {"status": "success"}]
    if not stream:
        return JSONResponse(lines[-1])

    async def chunks() -> AsyncIterator[bytes]:
        for item in lines:
            yield line(item)

    return ndjson_response(chunks())
