"""Several models behind one server: which are loaded, loading them on demand, unloading.

Each model of the config has an entry. ``acquire`` returns a loaded ``ModelState``,
loading the model first if needed (in a worker thread: the event loop keeps serving
other models) after making room: while the limits (``server.max_loaded_models``,
``server.max_loaded_bytes``) would be passed, the least recently used model with no
request in flight is unloaded. ``server.model_idle_seconds`` unloads a model nobody has
used for that long. Unloading stops the model's engine, which first saves its cached
sequences to the disk cache, so the model's next load starts warm.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from api.web.errors import APIError
from engine.config import Config, ModelConfig

if TYPE_CHECKING:
    from api.web.state import ModelState

log = logging.getLogger("llamaserve.models")

WAIT_FOR_ROOM = 60.0  # seconds a load waits for a busy model to become idle
Loader = Callable[[ModelConfig], "ModelState"]


@dataclass(eq=False)
class ModelEntry:
    config: ModelConfig
    state: ModelState | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = 0.0
    size: int = 0  # bytes of weights + KV, estimated before the first load, then measured
    loads: int = 0
    leases: int = 0  # requests between routing and their last byte (api.web.gate releases)

    @property
    def name(self) -> str:
        return self.config.served_name()

    @property
    def busy(self) -> bool:
        state = self.state
        return state is not None and (self.leases > 0 or state.client.outstanding > 0)


def file_bytes(cfg: ModelConfig) -> int:
    """The model's files on disk: a first estimate of what loading it takes."""
    paths = [cfg.path, cfg.draft_model_path, cfg.mtmd.mmproj_path if cfg.mtmd else None,
             *[x.path for x in cfg.loras]]
    return sum(os.path.getsize(p) for p in paths if p and os.path.isfile(p))


class ModelRegistry:
    def __init__(self, config: Config, load: Loader) -> None:
        self.config = config
        self.load = load
        self.entries = {m.served_name(): ModelEntry(m, size=file_bytes(m))
                        for m in config.all_models}
        self.first = config.model.served_name()
        # adapter name -> its model (a request naming an adapter goes to that model)
        self.adapters = {x.name: m.served_name() for m in config.all_models for x in m.loras}
        self._idle_task: asyncio.Task[None] | None = None

    # -- lookups -------------------------------------------------------------------------
    def resolve(self, model: Any) -> str:
        if not isinstance(model, str) or not model:
            return self.first
        if model in self.entries:
            return model
        if model in self.adapters:
            return self.adapters[model]
        if not self.config.several:
            return self.first  # one model: any name reaches it, as before
        raise APIError(f"The model '{model[:200]}' does not exist", status=404, param="model",
                       code="model_not_found", type="invalid_request_error")

    def loaded(self, name: str) -> ModelState | None:
        return self.entries[name].state

    def loaded_states(self) -> list[ModelState]:
        return [e.state for e in self.entries.values() if e.state is not None]

    # -- loading -------------------------------------------------------------------------
    def adopt(self, state: ModelState) -> None:
        """A model loaded before the event loop ran (the first one, at start)."""
        entry = self.entries[state.model_name]
        entry.state = state
        entry.loads += 1
        entry.size = max(entry.size, measured_bytes(state))
        entry.last_used = time.monotonic()

    async def acquire(self, name: str, scope: MutableMapping[str, Any] | None = None) -> ModelState:
        entry = self.entries[name]
        state = entry.state if entry.state is not None else await self._load(entry)
        entry.last_used = time.monotonic()
        if scope is not None:  # no await since the check: it cannot have been unloaded
            entry.leases += 1

            def release() -> None:
                entry.leases -= 1
                entry.last_used = time.monotonic()
            scope.setdefault("llamaserve", {}).setdefault("leases", []).append(release)
        return state

    async def _load(self, entry: ModelEntry) -> ModelState:
        name = entry.name
        async with entry.lock:
            if entry.state is None:
                await self._make_room(entry)
                log.info("loading model %s", name)
                started = time.monotonic()
                try:
                    state = await asyncio.to_thread(self.load, entry.config)
                except Exception as exc:
                    log.exception("could not load model %s", name)
                    raise APIError(f"The model '{name}' could not be loaded: {exc}",
                                   status=503, code="model_load_failed") from None
                state.client.start()
                entry.state = state
                entry.loads += 1
                entry.size = max(entry.size, measured_bytes(state))
                log.info("model %s loaded in %.1f s", name, time.monotonic() - started)
        assert entry.state is not None
        return entry.state

    def _over(self, adding: ModelEntry) -> bool:
        limits = self.config.server
        loaded = [e for e in self.entries.values() if e.state is not None]
        if limits.max_loaded_models and len(loaded) + 1 > limits.max_loaded_models:
            return True
        return bool(limits.max_loaded_bytes) and \
            sum(e.size for e in loaded) + adding.size > limits.max_loaded_bytes

    async def _make_room(self, adding: ModelEntry) -> None:
        """Unload idle models, least recently used first, until ``adding`` fits; wait for a
        busy one to finish (up to WAIT_FOR_ROOM seconds) when none is idle."""
        deadline = time.monotonic() + WAIT_FOR_ROOM
        while self._over(adding):
            loaded = [e for e in self.entries.values() if e.state is not None]
            if not loaded:
                return  # alone it does not fit: load it anyway, as a single model would
            idle = [e for e in loaded if not e.busy]
            if idle:
                await self.unload(min(idle, key=lambda e: e.last_used))
            elif time.monotonic() > deadline:
                raise APIError(f"Cannot load '{adding.name}' now: the loaded models are busy "
                               "and the server's model limits are reached; retry shortly.",
                               status=503, code="models_busy", headers={"Retry-After": "2"})
            else:
                await asyncio.sleep(0.1)

    async def unload(self, entry: ModelEntry) -> None:
        state, entry.state = entry.state, None
        if state is None:
            return
        log.info("unloading model %s", entry.name)
        await asyncio.to_thread(close_state, state)

    # -- idle unloading ----------------------------------------------------------------------
    def start(self) -> None:
        if self.config.server.model_idle_seconds > 0 and self._idle_task is None:
            self._idle_task = asyncio.ensure_future(self._unload_idle())

    async def _unload_idle(self) -> None:
        limit = self.config.server.model_idle_seconds
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = time.monotonic()
            for entry in self.entries.values():
                if entry.state is not None and not entry.busy \
                        and now - entry.last_used > limit and not entry.lock.locked():
                    await self.unload(entry)

    def stop(self) -> None:
        """Stop every engine (shutdown; blocking)."""
        if self._idle_task is not None:
            self._idle_task.cancel()
        for entry in self.entries.values():
            state, entry.state = entry.state, None
            if state is not None:
                close_state(state)


def measured_bytes(state: ModelState) -> int:
    """Weights (file sizes) plus the KV cache the context allocated."""
    return file_bytes(state.model_config) + state.model.kv_bytes()


def close_state(state: ModelState) -> None:
    state.client.stop()
    state.model.close()
